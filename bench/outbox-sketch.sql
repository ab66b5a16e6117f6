-- What the outbox's write path costs PostgreSQL per task, against a sketch
-- of an outbox with no per-row update: an append-only log whose relay
-- records one row per published batch and advances one position.
--
-- Run it with psql on an empty database that `ingest-worker migrate` made
-- for it (it refuses one that holds tasks or outbox rows, and leaves the
-- outbox empty again):
--
--   createdb sketch && INGEST_DATABASE_URL=postgres:///sketch ingest-worker migrate
--   psql -d sketch -f bench/outbox-sketch.sql
--
-- Each design writes 100,000 rows in transactions of 1,000 (a backlog of
-- CreateTx batches) and then publishes them in passes of 100 (the relay's
-- batch), without Redis: the entry ids are made up. "today" is the
-- outbox_event of the migrations (partitioned, four indexes, the NOTIFY
-- trigger; a pass locks its rows FOR UPDATE SKIP LOCKED and updates each
-- SENT with its entry id). "log" is a table of its own (primary key, the
-- task and created_at indexes); a pass locks the position row, reads the
-- next 100 rows by id, inserts one batch row holding their entry ids and
-- moves the position. The sketch leaves out what a real log needs to be
-- correct and would cost a little more: rows ordered by their commit
-- (transaction ids and snapshots, as PgQ does), failed publishes
-- recorded per row, and an outbox_event view over the two tables. It
-- prints the WAL bytes and the time per task of each phase, for each of
-- three rounds.
\set ON_ERROR_STOP on
\set QUIET on
\pset footer off
DO $$ BEGIN
    IF EXISTS (SELECT 1 FROM outbox_event) OR EXISTS (SELECT 1 FROM ingest_task) THEN
        RAISE EXCEPTION 'outbox-sketch.sql runs on an empty database made for it: this one holds tasks or outbox rows';
    END IF;
END $$;

CREATE TEMP TABLE sketch_result (design text, round int, insert_wal bigint, publish_wal bigint,
    insert_us numeric, publish_us numeric);

CREATE TABLE sketch_log (id bigserial PRIMARY KEY, task_id uuid NOT NULL, stream text NOT NULL,
    next_retry_at timestamptz NOT NULL DEFAULT now(), created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX sketch_log_task_idx ON sketch_log (task_id, id);
CREATE INDEX sketch_log_created_idx ON sketch_log (created_at DESC);
CREATE TABLE sketch_batch (id bigserial PRIMARY KEY, first_id bigint NOT NULL, last_id bigint NOT NULL,
    relay text NOT NULL, sent_at timestamptz NOT NULL, stream_ids text[] NOT NULL);
CREATE INDEX sketch_batch_last_idx ON sketch_batch (last_id);
CREATE TABLE sketch_position (one boolean PRIMARY KEY, pos bigint NOT NULL);

CREATE PROCEDURE sketch_today(round int) LANGUAGE plpgsql AS $$
DECLARE
    l0 pg_lsn; l1 pg_lsn; l2 pg_lsn; t0 timestamptz; t1 timestamptz; t2 timestamptz;
    ids bigint[];
BEGIN
    TRUNCATE outbox_event;
    COMMIT;
    CHECKPOINT;
    l0 := pg_current_wal_lsn(); t0 := clock_timestamp();
    FOR b IN 1 .. 100 LOOP
        INSERT INTO outbox_event (task_id, stream, next_retry_at)
        SELECT gen_random_uuid(), 'ingest:tasks', now() FROM generate_series(1, 1000);
        COMMIT;
    END LOOP;
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
    INSERT INTO sketch_result VALUES ('today', round, pg_wal_lsn_diff(l1, l0), pg_wal_lsn_diff(l2, l1),
        extract(epoch FROM t1 - t0) * 1e6, extract(epoch FROM t2 - t1) * 1e6);
    TRUNCATE outbox_event;
    COMMIT;
END;
$$;

CREATE PROCEDURE sketch_log(round int) LANGUAGE plpgsql AS $$
DECLARE
    l0 pg_lsn; l1 pg_lsn; l2 pg_lsn; t0 timestamptz; t1 timestamptz; t2 timestamptz;
    p bigint; ids bigint[];
BEGIN
    TRUNCATE sketch_log, sketch_batch, sketch_position;
    INSERT INTO sketch_position VALUES (true, 0);
    COMMIT;
    CHECKPOINT;
    l0 := pg_current_wal_lsn(); t0 := clock_timestamp();
    FOR b IN 1 .. 100 LOOP
        INSERT INTO sketch_log (task_id, stream) SELECT gen_random_uuid(), 'ingest:tasks' FROM generate_series(1, 1000);
        COMMIT;
    END LOOP;
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
    INSERT INTO sketch_result VALUES ('log', round, pg_wal_lsn_diff(l1, l0), pg_wal_lsn_diff(l2, l1),
        extract(epoch FROM t1 - t0) * 1e6, extract(epoch FROM t2 - t1) * 1e6);
    COMMIT;
END;
$$;

CALL sketch_today(1);
CALL sketch_log(1);
CALL sketch_today(2);
CALL sketch_log(2);
CALL sketch_today(3);
CALL sketch_log(3);

SELECT design, round,
       round(insert_wal / 100000.0) AS "insert WAL B/task", round(publish_wal / 100000.0) AS "publish WAL B/task",
       round(insert_us / 100000, 1) AS "insert µs/task", round(publish_us / 100000, 1) AS "publish µs/task"
FROM sketch_result ORDER BY design DESC, round;

DROP PROCEDURE sketch_today(int);
DROP PROCEDURE sketch_log(int);
DROP TABLE sketch_log, sketch_batch, sketch_position;
