-- +goose Up
-- The outbox log: the rows of tasks created due now are appended to
-- outbox_log, and a relay publishes them without writing anything per row
-- (docs/ARCHITECTURE.md §3.1). Until now every row was inserted NEW into
-- outbox_row, then updated SENT by the relay's pass: a second version of
-- the row, its index entries and about 550 bytes of WAL per task.
--
-- Commit order, as PgQ keeps it. Each log row holds the id of the
-- transaction that wrote it (txid). Each round has a row holding its
-- snapshot; a round publishes the rows visible in its snapshot (cur) and
-- not in the round before's (prev), in the order of (txid, id): those of
-- transactions that prev saw in progress (its xip list), then an index
-- range from prev's xmax to cur's. A pass of a relay takes an advisory
-- lock (one pass at a time takes log rows), takes the round's next rows
-- after its cursor, the last row of the round's latest batch
-- (outbox_log_take), publishes them and, in the same transaction, records
-- one batch row with their entry ids (outbox_log_record). When a round has
-- nothing left the next take starts a new one from a fresh snapshot. The
-- position (outbox_log_position, a view) is the newest round and its
-- latest batch: nothing is updated, so a transaction held open, which
-- keeps every dead version of a row, leaves no chain of versions to walk.
-- A relay that dies before its commit leaves the position as it was: the
-- next pass publishes that batch again, and nothing else twice.
--
-- A row that failed to publish is moved into outbox_row (same id, RETRYING,
-- the relay's backoff), where the ordinary passes retry it; a row whose
-- task is gone is deleted. Rows of tasks with a group or a sequence are
-- written to outbox_row as before: the refills of a group's window and the
-- releases of a sequence read and write a task's latest row there.
--
-- outbox_event, the contract's view, becomes outbox_row UNION ALL
-- outbox_log_event: a log row shows NEW until its batch exists, then SENT
-- with its own entry id, its batch's relay (claimed_by) and time
-- (sent_at). Its batch is found by B-tree keys: the first round whose
-- snapshot sees the row's transaction, then that round's first batch that
-- ends at or after the row. Writing through the view keeps working: an
-- INSERT becomes an INSERT into outbox_row (a rule, so that one statement
-- stays one statement and the table's NOTIFY trigger fires once), an
-- UPDATE or DELETE of a row is carried out on the table that holds it
-- (INSTEAD OF triggers; an UPDATE of a log row moves it into outbox_row).
CREATE TABLE outbox_log (
    id         bigint      PRIMARY KEY DEFAULT nextval('outbox_event_id_seq'),
    task_id    uuid        NOT NULL,
    stream     text        NOT NULL CHECK (stream <> ''),
    txid       xid8        NOT NULL DEFAULT pg_current_xact_id(),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_log_txid_idx ON outbox_log (txid, id);
CREATE INDEX outbox_log_task_idx ON outbox_log (task_id, id);
CREATE INDEX outbox_log_created_idx ON outbox_log (created_at DESC);
COMMENT ON TABLE outbox_log IS
    'append-only rows of outbox_event for tasks created due now; published in commit order by rounds (outbox_log_round), each publish recorded by batch (outbox_log_batch)';

-- A round: its snapshot (which rows it takes) and that snapshot's xmax,
-- by which the view finds a row's round. Round 0 is the migration's.
CREATE TABLE outbox_log_round (
    round     bigint      PRIMARY KEY,
    snap      pg_snapshot NOT NULL,
    snap_xmax xid8        NOT NULL
);
CREATE INDEX outbox_log_round_xmax_idx ON outbox_log_round (snap_xmax, round);

-- One publish of a pass: the rows it published (event_ids, in take order),
-- the entry id of each (stream_ids) and the stream it went to (streams:
-- the stream of the task's priority), keyed by the last row it took.
CREATE TABLE outbox_log_batch (
    round      bigint      NOT NULL,
    last_txid  xid8        NOT NULL,
    last_id    bigint      NOT NULL,
    relay      text        NOT NULL,
    sent_at    timestamptz NOT NULL,
    event_ids  bigint[]    NOT NULL,
    stream_ids text[]      NOT NULL,
    streams    text[]      NOT NULL,
    PRIMARY KEY (round, last_txid, last_id)
);
CREATE INDEX outbox_log_batch_sent_idx ON outbox_log_batch (sent_at);

INSERT INTO outbox_log_round VALUES (0, pg_current_snapshot(), pg_snapshot_xmax(pg_current_snapshot()));

-- Where publishing stands: the newest round, its snapshot (cur) and the
-- one before (prev; round 0's own), and the last row taken in the round
-- (txid, id: its latest batch's, or zero), all read by keys.
CREATE VIEW outbox_log_position AS
SELECT r.round, coalesce(pr.snap, r.snap) AS prev, r.snap AS cur,
       coalesce(b.last_txid, '0'::xid8) AS txid, coalesce(b.last_id, 0) AS id
FROM (SELECT * FROM outbox_log_round ORDER BY round DESC LIMIT 1) r
LEFT JOIN LATERAL (SELECT p.snap FROM outbox_log_round p WHERE p.round < r.round ORDER BY p.round DESC LIMIT 1) pr ON true
LEFT JOIN LATERAL (SELECT b.last_txid, b.last_id FROM outbox_log_batch b WHERE b.round = r.round
                   ORDER BY b.last_txid DESC, b.last_id DESC LIMIT 1) b ON true;
COMMENT ON VIEW outbox_log_position IS
    'where publishing the outbox log stands: the newest round, its snapshot and the one before, and the last row taken in it';

-- The log's tables can be read and written by whoever can outbox_row.
-- +goose StatementBegin
DO $$
DECLARE
    g record;
    t text;
BEGIN
    FOR g IN SELECT a.privilege_type, a.grantee, a.is_grantable FROM pg_class c
             CROSS JOIN LATERAL aclexplode(c.relacl) a
             WHERE c.oid = 'outbox_row'::regclass AND a.grantee <> c.relowner LOOP
        FOREACH t IN ARRAY ARRAY['outbox_log', 'outbox_log_round', 'outbox_log_batch', 'outbox_log_position'] LOOP
            EXECUTE format('GRANT %s ON %I TO %s%s', g.privilege_type, t,
                CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END,
                CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- Relays are woken by a commit that wrote log rows, as by one that wrote
-- unsent outbox_row rows (outbox_event_notify, migration 00034).
-- +goose StatementBegin
CREATE FUNCTION outbox_log_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows) THEN
        IF current_setting('ingest.outbox_wake', true) IN ('caller', 'due') THEN
            PERFORM set_config('ingest.outbox_wake', 'due', true);
        ELSE
            PERFORM pg_notify('ingest_outbox', '');
        END IF;
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER outbox_log_notify AFTER INSERT ON outbox_log
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION outbox_log_notify();

-- outbox_log_take takes the log's advisory lock for its transaction (or
-- returns nothing when another pass holds it) and returns up to n rows of the round after its cursor,
-- in (txid, id) order, with what their messages need (orphan: the task is
-- gone). When the round has nothing left and rows committed since its
-- snapshot, it starts the next round and takes from it.
-- +goose StatementBegin
CREATE FUNCTION outbox_log_take(n integer)
RETURNS TABLE (id bigint, task_id uuid, stream text, txid text, kind text, created_at timestamptz,
               traceparent text, priority smallint, orphan boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    pos outbox_log_position;
    snap pg_snapshot;
    fresh boolean := false;
BEGIN
    IF n IS NULL OR n < 1 THEN
        RAISE EXCEPTION 'outbox_log_take takes at least one row, not %', n;
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtextextended('ingest-worker outbox log', 0)) THEN
        RETURN;
    END IF;
    SELECT * INTO pos FROM outbox_log_position;
    LOOP
        RETURN QUERY
        WITH d AS (
            SELECT u.id, u.task_id, u.stream, u.txid, u.created_at FROM (
                (SELECT l.id, l.task_id, l.stream, l.txid, l.created_at FROM outbox_log l
                 WHERE l.txid = ANY (ARRAY(SELECT pg_snapshot_xip(pos.prev)))
                   AND (l.txid, l.id) > (pos.txid, pos.id)
                   AND pg_visible_in_snapshot(l.txid, pos.cur)
                 ORDER BY l.txid, l.id LIMIT n)
                UNION ALL
                (SELECT l.id, l.task_id, l.stream, l.txid, l.created_at FROM outbox_log l
                 WHERE (l.txid, l.id) > (greatest(pos.txid, pg_snapshot_xmax(pos.prev)),
                                         CASE WHEN pos.txid >= pg_snapshot_xmax(pos.prev) THEN pos.id ELSE 0 END)
                   AND l.txid < pg_snapshot_xmax(pos.cur)
                   AND pg_visible_in_snapshot(l.txid, pos.cur)
                 ORDER BY l.txid, l.id LIMIT n)) u
            ORDER BY u.txid, u.id LIMIT n
        )
        SELECT d.id, d.task_id, d.stream, d.txid::text, coalesce(t.kind, ''), d.created_at,
               coalesce(t.traceparent, ''), coalesce(t.priority, 2)::smallint, t.id IS NULL
        FROM d LEFT JOIN ingest_task t ON t.id = d.task_id
        ORDER BY d.txid, d.id;
        IF FOUND OR fresh THEN
            RETURN;
        END IF;
        -- A new round only when rows committed since this one's snapshot
        -- (an idle relay's passes write nothing): rows of a transaction
        -- the snapshot saw in progress, or past its xmax, each found by
        -- the txid index (a transaction held open keeps the snapshot's
        -- xmin back: a range from there would read every row since).
        IF NOT EXISTS (SELECT 1 FROM outbox_log l WHERE l.txid >= pg_snapshot_xmax(pos.cur))
           AND NOT EXISTS (SELECT 1 FROM outbox_log l WHERE l.txid = ANY (ARRAY(SELECT pg_snapshot_xip(pos.cur)))) THEN
            RETURN;
        END IF;
        snap := pg_current_snapshot();
        INSERT INTO outbox_log_round VALUES (pos.round + 1, snap, pg_snapshot_xmax(snap));
        pos := ROW(pos.round + 1, pos.cur, snap, '0'::xid8, 0::bigint);
        fresh := true;
    END LOOP;
END;
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION outbox_log_take(integer) IS
    'takes the outbox log''s advisory lock (or returns nothing: another pass holds it) and returns up to n rows of the round after its cursor, in commit order; starts the next round when this one is done';

-- outbox_log_record records, in the transaction of the take (which holds
-- the log's advisory lock), the publish of the rows it took up to
-- (last_txid, last_id): one batch row, whose last row is the round's
-- cursor from then on, with the rows ids published as stream_ids to
-- streams (the others were moved or deleted). It returns the batch's
-- time.
-- +goose StatementBegin
CREATE FUNCTION outbox_log_record(relay text, last_txid text, last_id bigint, ids bigint[], stream_ids text[], streams text[])
RETURNS timestamptz LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    pos outbox_log_position;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended('ingest-worker outbox log', 0)) THEN
        RAISE EXCEPTION 'outbox log batch recorded by a transaction that did not take its rows';
    END IF;
    SELECT * INTO pos FROM outbox_log_position;
    IF (last_txid::xid8, last_id) <= (pos.txid, pos.id) THEN
        RAISE EXCEPTION 'outbox log batch ending at (%, %) is not after the position (%, %)', last_txid, last_id, pos.txid, pos.id;
    END IF;
    INSERT INTO outbox_log_batch VALUES (pos.round, last_txid::xid8, last_id, relay, statement_timestamp(),
                                         coalesce(ids, '{}'), coalesce(stream_ids, '{}'), coalesce(streams, '{}'));
    RETURN statement_timestamp();
END;
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION outbox_log_record(text, text, bigint, bigint[], text[], text[]) IS
    'records a pass''s publish of the outbox log''s rows it took: one batch row, whose last row is the round''s cursor';

-- outbox_log_prune retires the log rows published before keep ago (the
-- age at which outbox_row's partitions go): the rows of tasks that still
-- exist move into outbox_row, SENT as the view showed them (as a dropped
-- partition's rows of such tasks move into its DEFAULT partition), the
-- others are deleted. Then it deletes the batches that hold none of the
-- remaining rows, and the rounds without batches before the one before the
-- current one (whose snapshot is the position's prev).
-- It returns how many rows it retired.
-- +goose StatementBegin
CREATE FUNCTION outbox_log_prune(keep interval) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    pos outbox_log_position;
    cutoff timestamptz := now() - keep;
    n bigint;
    low bigint;
BEGIN
    IF keep IS NULL OR keep < interval '0' THEN
        RAISE EXCEPTION 'outbox log retention must not be negative, not %', keep;
    END IF;
    SELECT * INTO pos FROM outbox_log_position;
    INSERT INTO outbox_row (id, task_id, stream, status, attempt_count, next_retry_at, claimed_by, claimed_until,
                            last_error, stream_id, created_at, sent_at)
    SELECT e.id, e.task_id, e.stream, e.status, e.attempt_count, e.next_retry_at, e.claimed_by, e.claimed_until,
           e.last_error, e.stream_id, e.created_at, e.sent_at
    FROM outbox_log_event e
    WHERE e.created_at < cutoff AND e.status = 'SENT'
      AND EXISTS (SELECT 1 FROM outbox_log l WHERE l.id = e.id AND pg_visible_in_snapshot(l.txid, pos.prev))
      AND EXISTS (SELECT 1 FROM ingest_task t WHERE t.id = e.task_id);
    DELETE FROM outbox_log l WHERE l.created_at < cutoff AND pg_visible_in_snapshot(l.txid, pos.prev);
    GET DIAGNOSTICS n = ROW_COUNT;
    SELECT min(l.id) INTO low FROM outbox_log l;
    DELETE FROM outbox_log_batch b
    WHERE b.round < pos.round AND (low IS NULL OR coalesce((SELECT max(e) FROM unnest(b.event_ids) AS e), 0) < low);
    DELETE FROM outbox_log_round r
    WHERE r.round < pos.round - 1 AND NOT EXISTS (SELECT 1 FROM outbox_log_batch b WHERE b.round = r.round);
    RETURN n;
END;
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION outbox_log_prune(interval) IS
    'retires the outbox log''s rows published before keep ago (those of tasks that exist move into outbox_row), and the batches and rounds no remaining row needs; returns how many rows';

-- The log's rows as outbox_event shows them. Ordered by created_at, so
-- that the seed's query (ORDER BY created_at DESC LIMIT 20 over
-- outbox_event) reads the newest rows by index and looks up only their
-- batches.
CREATE VIEW outbox_log_event AS
SELECT l.id, l.task_id, coalesce(b.dest, l.stream) AS stream,
       CASE WHEN b.stream_id IS NOT NULL THEN 'SENT' ELSE 'NEW' END AS status,
       0 AS attempt_count, l.created_at AS next_retry_at, b.relay AS claimed_by, NULL::timestamptz AS claimed_until,
       NULL::text AS last_error, b.stream_id, l.created_at, b.sent_at
FROM outbox_log l
LEFT JOIN LATERAL (
    SELECT x.relay, x.sent_at, x.stream_ids[x.i] AS stream_id, x.streams[x.i] AS dest
    FROM (SELECT r.round FROM outbox_log_round r
          WHERE r.snap_xmax > l.txid AND pg_visible_in_snapshot(l.txid, r.snap)
          ORDER BY r.snap_xmax, r.round LIMIT 1) r
    CROSS JOIN LATERAL (
        SELECT b.relay, b.sent_at, b.stream_ids, b.streams, array_position(b.event_ids, l.id) AS i
        FROM outbox_log_batch b
        WHERE b.round = r.round AND (b.last_txid, b.last_id) >= (l.txid, l.id)
        ORDER BY b.last_txid, b.last_id LIMIT 1) x
    WHERE x.i IS NOT NULL) b ON true
ORDER BY l.created_at DESC;
COMMENT ON VIEW outbox_log_event IS
    'the rows of outbox_log as outbox_event shows them: NEW, or SENT once a batch recorded their publish';

-- The log's rows not yet taken by a round: not in its snapshot, or in it
-- and after its cursor (the backlog gauges read them). Every such row is
-- past the older snapshot's xmax or of a transaction one of the two
-- snapshots saw in progress: an index range from that xmax, and lookups
-- of those transactions (a transaction held open keeps the snapshots'
-- xmin back: a range from there would read every row since).
CREATE VIEW outbox_log_unsent AS
SELECT l.id, l.task_id, l.stream, l.txid, l.created_at
FROM outbox_log_position p
CROSS JOIN LATERAL (
    SELECT r.* FROM outbox_log r WHERE r.txid >= pg_snapshot_xmax(p.prev)
    UNION ALL
    SELECT r.* FROM outbox_log r
    WHERE r.txid < pg_snapshot_xmax(p.prev)
      AND r.txid = ANY (ARRAY(SELECT pg_snapshot_xip(p.prev) UNION SELECT pg_snapshot_xip(p.cur)))
) l
WHERE NOT pg_visible_in_snapshot(l.txid, p.cur) OR (l.txid, l.id) > (p.txid, p.id);
COMMENT ON VIEW outbox_log_unsent IS
    'the rows of outbox_log that no round has taken yet';

CREATE OR REPLACE VIEW outbox_event AS
SELECT id, task_id, stream, status, attempt_count, next_retry_at, claimed_by, claimed_until, last_error, stream_id, created_at, sent_at
FROM outbox_row
UNION ALL
SELECT id, task_id, stream, status, attempt_count, next_retry_at, claimed_by, claimed_until, last_error, stream_id, created_at, sent_at
FROM outbox_log_event;
COMMENT ON VIEW outbox_event IS
    'one row per publication of a task: the rows of outbox_row and of outbox_log';
ALTER VIEW outbox_event ALTER COLUMN id SET DEFAULT nextval('outbox_event_id_seq');
ALTER VIEW outbox_event ALTER COLUMN status SET DEFAULT 'NEW';
ALTER VIEW outbox_event ALTER COLUMN attempt_count SET DEFAULT 0;
ALTER VIEW outbox_event ALTER COLUMN next_retry_at SET DEFAULT now();
ALTER VIEW outbox_event ALTER COLUMN created_at SET DEFAULT now();

CREATE RULE outbox_event_insert AS ON INSERT TO outbox_event DO INSTEAD
INSERT INTO outbox_row (id, task_id, stream, status, attempt_count, next_retry_at, claimed_by, claimed_until,
                        last_error, stream_id, created_at, sent_at)
VALUES (NEW.id, NEW.task_id, NEW.stream, NEW.status, NEW.attempt_count, NEW.next_retry_at, NEW.claimed_by,
        NEW.claimed_until, NEW.last_error, NEW.stream_id, NEW.created_at, NEW.sent_at)
RETURNING outbox_row.id, outbox_row.task_id, outbox_row.stream, outbox_row.status, outbox_row.attempt_count,
          outbox_row.next_retry_at, outbox_row.claimed_by, outbox_row.claimed_until, outbox_row.last_error,
          outbox_row.stream_id, outbox_row.created_at, outbox_row.sent_at;

-- +goose StatementBegin
CREATE FUNCTION outbox_event_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM outbox_row o WHERE o.id = OLD.id;
        IF NOT FOUND THEN
            DELETE FROM outbox_log l WHERE l.id = OLD.id;
            IF NOT FOUND THEN
                RETURN NULL;
            END IF;
        END IF;
        RETURN OLD;
    END IF;
    UPDATE outbox_row o SET id = NEW.id, task_id = NEW.task_id, stream = NEW.stream, status = NEW.status,
        attempt_count = NEW.attempt_count, next_retry_at = NEW.next_retry_at, claimed_by = NEW.claimed_by,
        claimed_until = NEW.claimed_until, last_error = NEW.last_error, stream_id = NEW.stream_id,
        created_at = NEW.created_at, sent_at = NEW.sent_at
    WHERE o.id = OLD.id;
    IF NOT FOUND THEN
        DELETE FROM outbox_log l WHERE l.id = OLD.id;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        INSERT INTO outbox_row (id, task_id, stream, status, attempt_count, next_retry_at, claimed_by, claimed_until,
                                last_error, stream_id, created_at, sent_at)
        VALUES (NEW.id, NEW.task_id, NEW.stream, NEW.status, NEW.attempt_count, NEW.next_retry_at, NEW.claimed_by,
                NEW.claimed_until, NEW.last_error, NEW.stream_id, NEW.created_at, NEW.sent_at);
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER outbox_event_write INSTEAD OF UPDATE OR DELETE ON outbox_event
    FOR EACH ROW EXECUTE FUNCTION outbox_event_write();

-- +goose Down
-- The log's rows go into outbox_row as outbox_event shows them, and
-- outbox_event is the view of outbox_row alone again.
INSERT INTO outbox_row (id, task_id, stream, status, attempt_count, next_retry_at, claimed_by, claimed_until,
                        last_error, stream_id, created_at, sent_at)
SELECT id, task_id, stream, status, attempt_count, next_retry_at, claimed_by, claimed_until, last_error, stream_id,
       created_at, sent_at
FROM outbox_log_event ORDER BY id;
DROP TRIGGER outbox_event_write ON outbox_event;
DROP FUNCTION outbox_event_write();
DROP RULE outbox_event_insert ON outbox_event;
-- The view of outbox_row alone again, replaced in place so that it keeps
-- its grants; its column defaults go (the table's apply through it).
CREATE OR REPLACE VIEW outbox_event AS SELECT id, task_id, stream, status, attempt_count, next_retry_at, claimed_by, claimed_until, last_error, stream_id, created_at, sent_at FROM outbox_row;
ALTER VIEW outbox_event ALTER COLUMN id DROP DEFAULT;
ALTER VIEW outbox_event ALTER COLUMN status DROP DEFAULT;
ALTER VIEW outbox_event ALTER COLUMN attempt_count DROP DEFAULT;
ALTER VIEW outbox_event ALTER COLUMN next_retry_at DROP DEFAULT;
ALTER VIEW outbox_event ALTER COLUMN created_at DROP DEFAULT;
COMMENT ON VIEW outbox_event IS
    'one row per publication of a task: the rows of outbox_row';
DROP VIEW outbox_log_unsent;
DROP VIEW outbox_log_event;
DROP FUNCTION outbox_log_prune(interval);
DROP FUNCTION outbox_log_record(text, text, bigint, bigint[], text[], text[]);
DROP FUNCTION outbox_log_take(integer);
DROP VIEW outbox_log_position;
DROP TABLE outbox_log_batch, outbox_log_round, outbox_log;
DROP FUNCTION outbox_log_notify();
