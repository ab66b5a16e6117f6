-- What the outbox's write path costs PostgreSQL per task, against two
-- sketches of an outbox with no per-row update.
--
-- Run it with psql on an empty database that `ingest-worker migrate` made
-- for it (it refuses one that holds tasks or outbox rows, and leaves the
-- outbox empty again); the rounds with a transaction held open use the
-- dblink extension of PostgreSQL's contrib (Debian's postgresql-15 ships
-- it), which the script creates:
--
--   createdb sketch && INGEST_DATABASE_URL=postgres:///sketch ingest-worker migrate
--   psql -d sketch -f bench/outbox-sketch.sql             # 100,000 rows a round
--   psql -d sketch -v rows=10000 -f bench/outbox-sketch.sql
--
-- Each design writes the rows in transactions of 1,000 (a backlog of
-- CreateTx batches) and then publishes them in passes of 100 (the relay's
-- batch), without Redis: the entry ids are made up.
--
-- "today" is the outbox_event of the migrations (partitioned, four
-- indexes, the NOTIFY trigger; a pass locks its rows FOR UPDATE SKIP
-- LOCKED and updates each SENT with its entry id).
--
-- "log" is a table of its own (primary key, the task and created_at
-- indexes); a pass locks the position row, reads the next 100 rows by id,
-- inserts one batch row holding their entry ids and moves the position.
-- It takes rows in the order of their ids, not of their commits, so a
-- transaction that takes its ids first and commits last would be skipped:
-- it bounds what such a design could save and is not correct as it stands.
--
-- "snapshot" adds what the log needs to take rows in commit order, as PgQ
-- does: each row holds the id of the transaction that wrote it (xid8, an
-- index on it with the row's id), and the position row holds two
-- transaction snapshots and a cursor. A round publishes the rows visible
-- in its snapshot and not in the round before's: those of the
-- transactions the earlier snapshot saw in progress (its xip list, by the
-- index), then those of later transactions up to the snapshot's xmax (an
-- index range from the cursor); rows of transactions still in progress
-- wait for the next round. A transaction held open does not widen a
-- pass's scan (it is only an entry of the xip list), where today's claim
-- index keeps every dead entry a held transaction stops vacuum from
-- removing. A view (what outbox_event would be) shows each row SENT once
-- its batch exists, with the batch's time and the row's own entry id,
-- finding the batch by B-tree keys: the first round whose snapshot sees
-- the row, then the first batch of that round that ends at or after it.
-- The script checks that every row is published once and shown SENT with
-- its entry id by the view, and that rows written by a transaction that
-- began first and committed last are published by the next pass.
--
-- "handoff" takes the log's rows by the same snapshot rounds, but a pass
-- writes each row it published into outbox_event, SENT with its entry id,
-- as the service writes a task it publishes after its commit, instead of
-- one batch row: no view over batches, the log only holds what is not yet
-- published (a view of outbox_event would show those NEW), at the cost of
-- a row with its index entries per task at publish. The script checks that
-- every row of the log is in outbox_event once, SENT with its entry id.
--
-- Left out of the sketches, and needed by a design of the service:
-- failed publishes recorded per row, the other columns of outbox_event,
-- and the writers of the service moved to the log. The script prints the
-- WAL bytes and the time per task of writing and of publishing, for each
-- design and round, the last rounds with a transaction holding a
-- transaction id open throughout, and the time of the seed's query of
-- outbox_event through the view.
\set ON_ERROR_STOP on
\set QUIET on
\pset footer off
\if :{?rows}
\else
\set rows 100000
\endif
DO $$ BEGIN
    IF EXISTS (SELECT 1 FROM outbox_event) OR EXISTS (SELECT 1 FROM ingest_task) THEN
        RAISE EXCEPTION 'outbox-sketch.sql runs on an empty database made for it: this one holds tasks or outbox rows';
    END IF;
END $$;
CREATE EXTENSION IF NOT EXISTS dblink;

CREATE TEMP TABLE sketch_result (design text, round int, rows int, insert_wal bigint, publish_wal bigint,
    insert_us numeric, publish_us numeric);

CREATE TABLE sketch_log (id bigserial PRIMARY KEY, task_id uuid NOT NULL, stream text NOT NULL,
    next_retry_at timestamptz NOT NULL DEFAULT now(), created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX sketch_log_task_idx ON sketch_log (task_id, id);
CREATE INDEX sketch_log_created_idx ON sketch_log (created_at DESC);
CREATE TABLE sketch_batch (id bigserial PRIMARY KEY, first_id bigint NOT NULL, last_id bigint NOT NULL,
    relay text NOT NULL, sent_at timestamptz NOT NULL, stream_ids text[] NOT NULL);
CREATE INDEX sketch_batch_last_idx ON sketch_batch (last_id);
CREATE TABLE sketch_position (one boolean PRIMARY KEY, pos bigint NOT NULL);

CREATE TABLE sketch_snap_log (id bigserial PRIMARY KEY, task_id uuid NOT NULL, stream text NOT NULL,
    txid xid8 NOT NULL DEFAULT pg_current_xact_id(), status text NOT NULL DEFAULT 'NEW',
    next_retry_at timestamptz NOT NULL DEFAULT now(), created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX sketch_snap_log_task_idx ON sketch_snap_log (task_id, id);
CREATE INDEX sketch_snap_log_created_idx ON sketch_snap_log (created_at DESC);
CREATE INDEX sketch_snap_log_txid_idx ON sketch_snap_log (txid, id);
-- A round publishes the rows visible in its snapshot and not in the round
-- before's; its batches are consecutive in the order of (txid, id), so a
-- row's batch is found by B-tree keys: the first round whose snapshot sees
-- the row, then the first batch of that round that ends at or after it.
CREATE TABLE sketch_snap_round (round bigint PRIMARY KEY, snap pg_snapshot NOT NULL, snap_xmax xid8 NOT NULL);
CREATE INDEX sketch_snap_round_xmax_idx ON sketch_snap_round (snap_xmax);
CREATE TABLE sketch_snap_batch (round bigint NOT NULL, last_txid xid8 NOT NULL, last_id bigint NOT NULL,
    relay text NOT NULL, sent_at timestamptz NOT NULL, event_ids bigint[] NOT NULL, stream_ids text[] NOT NULL,
    PRIMARY KEY (round, last_txid, last_id));
-- prev and cur: the snapshots of the round before and of this round; txid
-- and id: the last row published in this round.
CREATE TABLE sketch_snap_position (one boolean PRIMARY KEY, round bigint NOT NULL, prev pg_snapshot NOT NULL,
    cur pg_snapshot NOT NULL, txid xid8 NOT NULL, id bigint NOT NULL);

-- What outbox_event would be over the log: a NEW row whose batch exists is
-- SENT, with the batch's time and its own entry id.
CREATE VIEW sketch_snap_event AS
SELECT l.id, l.task_id, l.stream, CASE WHEN b.sent_at IS NOT NULL THEN 'SENT' ELSE l.status END AS status,
       b.stream_ids[array_position(b.event_ids, l.id)] AS stream_id, l.created_at, b.sent_at
FROM sketch_snap_log l
LEFT JOIN LATERAL (
    SELECT b.sent_at, b.event_ids, b.stream_ids
    FROM (SELECT r.round FROM sketch_snap_round r
          WHERE l.status = 'NEW' AND r.snap_xmax > l.txid AND pg_visible_in_snapshot(l.txid, r.snap)
          ORDER BY r.snap_xmax LIMIT 1) r
    JOIN LATERAL (SELECT * FROM sketch_snap_batch b
                  WHERE b.round = r.round AND (b.last_txid, b.last_id) >= (l.txid, l.id)
                  ORDER BY b.last_txid, b.last_id LIMIT 1) b ON true) b ON true;

-- sketch_dsn is a dblink connection string for this database on this
-- server, whatever port and socket directory the server has.
CREATE FUNCTION sketch_dsn() RETURNS text LANGUAGE sql AS $$
    SELECT format('dbname=%s user=%s port=%s host=%s', current_database(), current_user, current_setting('port'),
        coalesce(host(inet_server_addr()), split_part(current_setting('unix_socket_directories'), ',', 1)));
$$;

-- sketch_hold opens (or, with open false, ends) a transaction of its own
-- session that holds a transaction id, as a client idle in transaction
-- does.
CREATE PROCEDURE sketch_hold(open boolean) LANGUAGE plpgsql AS $$
BEGIN
    IF open THEN
        PERFORM dblink_connect('sketch_held', sketch_dsn());
        PERFORM dblink_exec('sketch_held', 'BEGIN');
        PERFORM * FROM dblink('sketch_held', 'SELECT pg_current_xact_id()::text') AS t(x text);
    ELSE
        PERFORM dblink_exec('sketch_held', 'COMMIT');
        PERFORM dblink_disconnect('sketch_held');
    END IF;
END;
$$;

CREATE PROCEDURE sketch_record(design text, round int, n int, held boolean,
    l0 pg_lsn, l1 pg_lsn, l2 pg_lsn, t0 timestamptz, t1 timestamptz, t2 timestamptz) LANGUAGE sql AS $$
    INSERT INTO sketch_result VALUES (CASE WHEN held THEN design || ', held' ELSE design END, round, n,
        pg_wal_lsn_diff(l1, l0), pg_wal_lsn_diff(l2, l1),
        extract(epoch FROM t1 - t0) * 1e6, extract(epoch FROM t2 - t1) * 1e6);
$$;

-- sketch_write writes n rows into the outbox table tbl, a thousand a
-- transaction (a backlog of CreateTx batches; each table's defaults fill
-- the rest).
CREATE PROCEDURE sketch_write(tbl text, n int) LANGUAGE plpgsql AS $$
BEGIN
    FOR b IN 1 .. n / 1000 LOOP
        EXECUTE format($q$INSERT INTO %I (task_id, stream) SELECT gen_random_uuid(), 'ingest:tasks' FROM generate_series(1, 1000)$q$, tbl);
        COMMIT;
    END LOOP;
END;
$$;

CREATE PROCEDURE sketch_today(round int, n int, held boolean) LANGUAGE plpgsql AS $$
DECLARE
    l0 pg_lsn; l1 pg_lsn; l2 pg_lsn; t0 timestamptz; t1 timestamptz; t2 timestamptz;
    ids bigint[];
BEGIN
    TRUNCATE outbox_row;
    COMMIT;
    IF held THEN CALL sketch_hold(true); END IF;
    CHECKPOINT;
    l0 := pg_current_wal_lsn(); t0 := clock_timestamp();
    CALL sketch_write('outbox_event', n);
    l1 := pg_current_wal_lsn(); t1 := clock_timestamp();
    LOOP
        SELECT array_agg(id) INTO ids FROM (
            SELECT id FROM outbox_event WHERE status IN ('NEW', 'RETRYING') AND next_retry_at <= now()
            ORDER BY next_retry_at, id LIMIT 100 FOR UPDATE SKIP LOCKED) d;
        EXIT WHEN ids IS NULL;
        UPDATE outbox_event o SET status = 'SENT', sent_at = statement_timestamp(),
            stream_id = (1700000000000 + o.id)::text || '-0', claimed_by = 'sketch', claimed_until = NULL
        FROM unnest(ids) AS c(id) WHERE o.id = c.id AND o.status IN ('NEW', 'RETRYING');
        COMMIT;
    END LOOP;
    l2 := pg_current_wal_lsn(); t2 := clock_timestamp();
    IF held THEN CALL sketch_hold(false); END IF;
    CALL sketch_record('today', round, n, held, l0, l1, l2, t0, t1, t2);
    TRUNCATE outbox_row;
    COMMIT;
END;
$$;

CREATE PROCEDURE sketch_log(round int, n int) LANGUAGE plpgsql AS $$
DECLARE
    l0 pg_lsn; l1 pg_lsn; l2 pg_lsn; t0 timestamptz; t1 timestamptz; t2 timestamptz;
    p bigint; ids bigint[];
BEGIN
    TRUNCATE sketch_log, sketch_batch, sketch_position;
    INSERT INTO sketch_position VALUES (true, 0);
    COMMIT;
    CHECKPOINT;
    l0 := pg_current_wal_lsn(); t0 := clock_timestamp();
    CALL sketch_write('sketch_log', n);
    l1 := pg_current_wal_lsn(); t1 := clock_timestamp();
    LOOP
        SELECT pos INTO p FROM sketch_position WHERE one FOR UPDATE;
        SELECT array_agg(id ORDER BY id) INTO ids FROM (SELECT id FROM sketch_log WHERE id > p ORDER BY id LIMIT 100) d;
        EXIT WHEN ids IS NULL;
        INSERT INTO sketch_batch (first_id, last_id, relay, sent_at, stream_ids)
        VALUES (ids[1], ids[cardinality(ids)], 'sketch', statement_timestamp(),
                ARRAY(SELECT (1700000000000 + x)::text || '-0' FROM unnest(ids) AS x));
        UPDATE sketch_position SET pos = ids[cardinality(ids)] WHERE one;
        COMMIT;
    END LOOP;
    COMMIT;
    l2 := pg_current_wal_lsn(); t2 := clock_timestamp();
    CALL sketch_record('log', round, n, false, l0, l1, l2, t0, t1, t2);
    COMMIT;
END;
$$;

-- sketch_snapshot_publish runs passes of the snapshot design until a
-- fresh round finds nothing, and returns how many rows they published.
-- With handoff, a pass writes its rows into outbox_event, SENT, instead of
-- a batch row.
CREATE PROCEDURE sketch_snapshot_publish(INOUT published bigint, handoff boolean) LANGUAGE plpgsql AS $$
DECLARE
    pos sketch_snap_position; ids bigint[]; txs xid8[]; fresh boolean := false; snap pg_snapshot;
BEGIN
    published := 0;
    LOOP
        SELECT * INTO pos FROM sketch_snap_position WHERE one FOR UPDATE;
        SELECT array_agg(id ORDER BY txid, id), array_agg(txid ORDER BY txid, id) INTO ids, txs FROM (
            SELECT id, txid FROM (
                (SELECT l.id, l.txid FROM sketch_snap_log l
                 WHERE l.txid = ANY (ARRAY(SELECT pg_snapshot_xip(pos.prev)))
                   AND (l.txid, l.id) > (pos.txid, pos.id)
                   AND pg_visible_in_snapshot(l.txid, pos.cur)
                 ORDER BY l.txid, l.id LIMIT 100)
                UNION ALL
                (SELECT l.id, l.txid FROM sketch_snap_log l
                 WHERE (l.txid, l.id) > (greatest(pos.txid, pg_snapshot_xmax(pos.prev)),
                                         CASE WHEN pos.txid >= pg_snapshot_xmax(pos.prev) THEN pos.id ELSE 0 END)
                   AND l.txid < pg_snapshot_xmax(pos.cur)
                   AND pg_visible_in_snapshot(l.txid, pos.cur)
                 ORDER BY l.txid, l.id LIMIT 100)) u
            ORDER BY txid, id LIMIT 100) d;
        IF ids IS NULL THEN
            EXIT WHEN fresh;
            -- The round is done: the next one takes what committed since.
            snap := pg_current_snapshot();
            INSERT INTO sketch_snap_round VALUES (pos.round + 1, snap, pg_snapshot_xmax(snap));
            UPDATE sketch_snap_position SET round = pos.round + 1, prev = cur, cur = snap, txid = '0', id = 0 WHERE one;
            COMMIT;
            fresh := true;
            CONTINUE;
        END IF;
        fresh := false;
        IF handoff THEN
            INSERT INTO outbox_event (id, task_id, stream, status, stream_id, sent_at, claimed_by, created_at)
            SELECT l.id, l.task_id, l.stream, 'SENT', (1700000000000 + l.id)::text || '-0', statement_timestamp(),
                   'sketch', l.created_at
            FROM sketch_snap_log l WHERE l.id = ANY (ids) ORDER BY l.id;
        ELSE
            INSERT INTO sketch_snap_batch (round, last_txid, last_id, relay, sent_at, event_ids, stream_ids)
            VALUES (pos.round, txs[cardinality(txs)], ids[cardinality(ids)], 'sketch', statement_timestamp(), ids,
                    ARRAY(SELECT (1700000000000 + x)::text || '-0' FROM unnest(ids) AS x));
        END IF;
        UPDATE sketch_snap_position SET txid = txs[cardinality(txs)], id = ids[cardinality(ids)] WHERE one;
        published := published + cardinality(ids);
        COMMIT;
    END LOOP;
END;
$$;

CREATE PROCEDURE sketch_snapshot_reset() LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE sketch_snap_log, sketch_snap_round, sketch_snap_batch, sketch_snap_position, outbox_row;
    INSERT INTO sketch_snap_round VALUES (0, pg_current_snapshot(), pg_snapshot_xmax(pg_current_snapshot()));
    INSERT INTO sketch_snap_position VALUES (true, 0, pg_current_snapshot(), pg_current_snapshot(), '0', 0);
END;
$$;

-- sketch_snapshot_check fails unless every row was published exactly once.
CREATE PROCEDURE sketch_snapshot_check(handoff boolean) LANGUAGE plpgsql AS $$
DECLARE written bigint; published bigint; distinct_published bigint;
BEGIN
    SELECT count(*) INTO written FROM sketch_snap_log;
    IF handoff THEN
        -- Every row of the log is in outbox_event once, SENT with its entry id.
        SELECT count(*), count(DISTINCT o.id) FILTER (WHERE o.status = 'SENT' AND o.stream_id = (1700000000000 + l.id)::text || '-0')
        INTO published, distinct_published
        FROM outbox_event o JOIN sketch_snap_log l ON l.id = o.id AND l.task_id = o.task_id;
        IF published <> written OR distinct_published <> written OR (SELECT count(*) FROM outbox_event) <> written THEN
            RAISE EXCEPTION 'handoff: % rows written, % in outbox_event (% SENT with their entry id)', written, published, distinct_published;
        END IF;
        RETURN;
    END IF;
    SELECT count(*), count(DISTINCT e) INTO published, distinct_published
    FROM sketch_snap_batch b, unnest(b.event_ids) AS e JOIN sketch_snap_log l ON l.id = e;
    IF published <> written OR distinct_published <> written THEN
        RAISE EXCEPTION 'snapshot: % rows written, % published (% distinct)', written, published, distinct_published;
    END IF;
    -- The view finds each row's batch: SENT, with its own entry id.
    SELECT count(*) INTO published FROM sketch_snap_event
    WHERE status = 'SENT' AND stream_id = (1700000000000 + id)::text || '-0';
    IF published <> written THEN
        RAISE EXCEPTION 'snapshot: % rows written, % shown SENT with their entry id by the view', written, published;
    END IF;
END;
$$;

CREATE PROCEDURE sketch_snapshot(round int, n int, held boolean, handoff boolean) LANGUAGE plpgsql AS $$
DECLARE
    l0 pg_lsn; l1 pg_lsn; l2 pg_lsn; t0 timestamptz; t1 timestamptz; t2 timestamptz;
    published bigint;
BEGIN
    CALL sketch_snapshot_reset();
    COMMIT;
    IF held THEN CALL sketch_hold(true); END IF;
    CHECKPOINT;
    l0 := pg_current_wal_lsn(); t0 := clock_timestamp();
    CALL sketch_write('sketch_snap_log', n);
    l1 := pg_current_wal_lsn(); t1 := clock_timestamp();
    CALL sketch_snapshot_publish(published, handoff);
    COMMIT;
    l2 := pg_current_wal_lsn(); t2 := clock_timestamp();
    IF held THEN CALL sketch_hold(false); END IF;
    CALL sketch_snapshot_check(handoff);
    CALL sketch_record(CASE WHEN handoff THEN 'handoff' ELSE 'snapshot' END, round, n, held, l0, l1, l2, t0, t1, t2);
    TRUNCATE outbox_row;
    COMMIT;
END;
$$;

-- Commit order: a transaction that takes its ids first and commits after
-- a pass ran. Its rows are published by the next pass, once each.
CALL sketch_snapshot_reset();
SELECT dblink_connect('sketch_late', sketch_dsn()) \gset
SELECT dblink_exec('sketch_late', 'BEGIN') \gset
SELECT dblink_exec('sketch_late', $q$INSERT INTO sketch_snap_log (task_id, stream) SELECT gen_random_uuid(), 'late' FROM generate_series(1, 10)$q$) \gset
INSERT INTO sketch_snap_log (task_id, stream) SELECT gen_random_uuid(), 'early' FROM generate_series(1, 1000);
CALL sketch_snapshot_publish(0, false) \gset first_
SELECT dblink_exec('sketch_late', 'COMMIT') \gset
SELECT dblink_disconnect('sketch_late') \gset
CALL sketch_snapshot_publish(0, false) \gset second_
DO $$ BEGIN
    IF (SELECT max(id) FROM sketch_snap_log WHERE stream = 'late') > (SELECT min(id) FROM sketch_snap_log WHERE stream = 'early') THEN
        RAISE EXCEPTION 'commit order: the late transaction did not take its ids first';
    END IF;
END $$;
SELECT :first_published = 1000 AND :second_published = 10 AS commit_order_ok \gset
\if :commit_order_ok
\echo 'commit order: 1000 rows published by the first pass; the late transaction''s 10 (lower ids, committed after it) by the second'
\else
\echo 'commit order: first pass published' :first_published ', second' :second_published '(expected 1000 and 10)'
DO $$ BEGIN RAISE EXCEPTION 'commit order check failed'; END $$;
\endif
CALL sketch_snapshot_check(false);

CALL sketch_today(1, :rows, false);
CALL sketch_log(1, :rows);
CALL sketch_snapshot(1, :rows, false, true);
CALL sketch_snapshot(1, :rows, false, false);
CALL sketch_today(2, :rows, false);
CALL sketch_log(2, :rows);
CALL sketch_snapshot(2, :rows, false, true);
CALL sketch_snapshot(2, :rows, false, false);
CALL sketch_today(3, :rows, false);
CALL sketch_log(3, :rows);
CALL sketch_snapshot(3, :rows, false, true);
CALL sketch_snapshot(3, :rows, false, false);
CALL sketch_today(4, :rows, true);
CALL sketch_snapshot(4, :rows, true, true);
CALL sketch_snapshot(4, :rows, true, false);

-- The seed's query of outbox_event, through the view, over the last round's rows.
\timing on
SELECT count(*) AS "rows of the seed's query through the view" FROM (
    SELECT id, status, created_at, sent_at FROM sketch_snap_event ORDER BY created_at DESC LIMIT 20) q;
\timing off

SELECT design, round,
       round(insert_wal::numeric / rows) AS "insert WAL B/task", round(publish_wal::numeric / rows) AS "publish WAL B/task",
       round(insert_us / rows, 1) AS "insert µs/task", round(publish_us / rows, 1) AS "publish µs/task"
FROM sketch_result ORDER BY design DESC, round;

DROP PROCEDURE sketch_today(int, int, boolean);
DROP PROCEDURE sketch_log(int, int);
DROP PROCEDURE sketch_snapshot(int, int, boolean, boolean);
DROP PROCEDURE sketch_snapshot_publish(bigint, boolean);
DROP PROCEDURE sketch_snapshot_reset();
DROP PROCEDURE sketch_snapshot_check(boolean);
DROP PROCEDURE sketch_record(text, int, int, boolean, pg_lsn, pg_lsn, pg_lsn, timestamptz, timestamptz, timestamptz);
DROP PROCEDURE sketch_hold(boolean);
DROP PROCEDURE sketch_write(text, int);
DROP FUNCTION sketch_dsn();
DROP VIEW sketch_snap_event;
DROP TABLE sketch_log, sketch_batch, sketch_position, sketch_snap_log, sketch_snap_round, sketch_snap_batch, sketch_snap_position;
