-- +goose Up
-- outbox_event becomes a view over the table that holds its rows, renamed
-- outbox_row, so that what the view shows can later come from more than
-- one table (an outbox whose publishing writes no row of its own per
-- task, docs/ARCHITECTURE.md §3) while the contract's columns and queries
-- keep answering. Nothing else changes: the view selects every column of
-- the table, so PostgreSQL writes through it (an automatically updatable
-- view: INSERT, UPDATE, DELETE, RETURNING and FOR UPDATE reach the table's
-- rows, its defaults apply, its NOTIFY trigger fires), and the planner
-- reads the table's partitions and indexes as before.
--
-- The table keeps its partitions, indexes, constraints, sequence,
-- trigger and settings under their names (outbox_event_*). What must
-- name the table itself does so from now on: locks (LOCK TABLE on a view
-- locks every partition of the table, where the writers' lock of the
-- table alone is wanted), the partitions' DDL (CREATE TABLE ... LIKE,
-- ATTACH) and the catalog's view of the partitions and the sequence;
-- the functions below are those of migrations 00027, 00029 and 00036
-- with the table's name in those places. The table's grants are given on
-- the view too.
ALTER TABLE outbox_event RENAME TO outbox_row;
CREATE VIEW outbox_event AS SELECT id, task_id, stream, status, attempt_count, next_retry_at, claimed_by, claimed_until, last_error, stream_id, created_at, sent_at FROM outbox_row;
COMMENT ON VIEW outbox_event IS
    'one row per publication of a task: the rows of outbox_row';
COMMENT ON TABLE outbox_row IS
    'the rows of outbox_event (a view over it); partitioned by RANGE (id), ranges opened ahead by time: retention drops whole partitions';

-- +goose StatementBegin
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT a.privilege_type, a.grantee, a.is_grantable FROM pg_class c
             CROSS JOIN LATERAL aclexplode(c.relacl) a
             WHERE c.oid = 'outbox_row'::regclass AND a.grantee <> c.relowner LOOP
        EXECUTE format('GRANT %s ON outbox_event TO %s%s', g.privilege_type,
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_event_partitions()
RETURNS TABLE (name text, lo bigint, hi bigint, is_default boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT b.name, b.lo::bigint, b.hi::bigint, b.is_default
    FROM ingest_partition_bounds('outbox_row') b
    ORDER BY b.is_default, b.hi::bigint NULLS LAST, b.lo::bigint NULLS FIRST;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_event_last_id() RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    last bigint;
BEGIN
    EXECUTE format('SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM %s',
                   pg_get_serial_sequence('outbox_row', 'id')) INTO last;
    RETURN last;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_event_extend(width interval, ahead interval, min_ids bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    last bigint := outbox_event_last_id();
    since_id bigint;
    since_at timestamptz;
    rate float8 := 0;
    young float8 := 0;
    locked boolean := false;
    size bigint;
    reach bigint;
    guard bigint;
    goal bigint;
    lo bigint;
    hi bigint;
    newest text;
    opts text[];
    part text;
    n integer := 0;
BEGIN
    IF width IS NULL OR width <= interval '0' THEN
        RAISE EXCEPTION 'partition width must be positive, not %', width;
    END IF;
    IF min_ids IS NULL OR min_ids < 1 THEN
        RAISE EXCEPTION 'a partition holds at least one id, not %', min_ids;
    END IF;
    SELECT o.id, o.created_at INTO since_id, since_at FROM outbox_row o
    WHERE o.created_at >= now() - width ORDER BY o.created_at LIMIT 1;
    IF since_at < now() - interval '10 seconds' THEN
        rate := greatest(last - since_id, 0) / extract(epoch FROM now() - since_at);
    ELSIF since_at IS NOT NULL THEN
        -- Younger than 10 s: too short a span to size partitions by, but
        -- the guard must not assume no ids are being taken.
        young := greatest(last - since_id, 0) / greatest(extract(epoch FROM now() - since_at), 1);
    END IF;
    size := greatest(min_ids, ceil(rate * extract(epoch FROM width))::bigint);
    reach := greatest(min_ids, ceil(rate * extract(epoch FROM ahead))::bigint);
    guard := greatest(least(reach, greatest(min_ids, ceil(rate * 60)::bigint)), ceil(young * 60)::bigint);
    goal := last + reach;
    SELECT p.name, p.hi INTO newest, hi FROM outbox_event_partitions() p
    WHERE NOT p.is_default AND p.hi IS NOT NULL ORDER BY p.hi DESC LIMIT 1;
    IF hi IS NULL OR hi <= last THEN
        hi := last + 1;
    END IF;
    IF hi < last + guard THEN
        LOCK TABLE ONLY outbox_row IN SHARE MODE;
        locked := true;
        last := outbox_event_last_id();
        goal := last + reach;
        hi := greatest(hi, last + 1);
    END IF;
    SELECT c.reloptions INTO opts FROM pg_class c WHERE c.oid = to_regclass(quote_ident(newest));
    WHILE hi <= goal LOOP
        lo := hi;
        hi := lo + size;
        part := 'outbox_event_from_' || lo;
        EXECUTE format('CREATE TABLE %I (LIKE outbox_row INCLUDING CONSTRAINTS,
                            CONSTRAINT %I CHECK (id >= %s AND id < %s))',
                       part, part || '_bounds', lo, hi);
        IF opts IS NOT NULL THEN
            EXECUTE format('ALTER TABLE %I SET (%s)', part, array_to_string(opts, ', '));
        END IF;
        PERFORM outbox_event_index(part);
        -- The ids taken meanwhile may have come near: then the table is
        -- locked before the attach, as above, and the rows that ids past
        -- lo sent to the DEFAULT partition are moved with the others.
        IF NOT locked AND outbox_event_last_id() + guard >= lo THEN
            LOCK TABLE ONLY outbox_row IN SHARE MODE;
            locked := true;
        END IF;
        -- Rows written with ids of their own past the sequence, or past
        -- lo before the lock.
        IF to_regclass('outbox_event_default') IS NOT NULL THEN
            EXECUTE format('WITH m AS (DELETE FROM outbox_event_default WHERE id >= %s AND id < %s RETURNING *)
                            INSERT INTO %I SELECT * FROM m', lo, hi, part);
        END IF;
        EXECUTE format('ALTER TABLE outbox_row ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)', part, lo, hi);
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', part, part || '_bounds');
        n := n + 1;
    END LOOP;
    RETURN n;
END;
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION outbox_event_extend(interval, interval, bigint) IS
    'creates the partitions of outbox_event, each the ids width of time takes, from the newest one''s end (or the last id taken, under SHARE on the table when ids are within a minute of it) until they reach the ids ahead of time takes; returns how many';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_task_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids uuid[];
    ends text[];
    streams text[];
BEGIN
    -- The scan every statement pays: none ended (a create, a start),
    -- nothing more.
    IF NOT EXISTS (SELECT 1 FROM new_rows r WHERE r.to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')) THEN
        RETURN NULL;
    END IF;
    -- The ended tasks that an awaiter registered announced, 200 ids to a
    -- notification; one probe of an empty table when nobody awaits.
    IF EXISTS (SELECT 1 FROM ingest_task_awaited) THEN
        PERFORM pg_notify('ingest_task_done', string_agg(c.id::text, ','))
        FROM (SELECT r.task_id AS id, (row_number() OVER () - 1) / 200 AS chunk
              FROM new_rows r
              WHERE r.to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')
                AND EXISTS (SELECT 1 FROM ingest_task_awaited a WHERE a.task_id = r.task_id)) c
        GROUP BY c.chunk;
    END IF;

    -- Fair scheduling (package task, group.go): each run of a group that
    -- this statement ended hands its room in the group's window to the
    -- group's oldest parked task at once, so that a busy group's window
    -- stays full without waiting for a release. One probe of
    -- ingest_task_parked_group_idx when no task with a group is parked;
    -- kinds that are paused or limited are left to their releases (the
    -- worker that frees a slot, the leader's releaser), but for a kind
    -- whose only limit is concurrency_per_group: its window is at most
    -- that limit, so a task that takes the room of an ended run of its
    -- group cannot take its group past it (and its start still reserves
    -- a slot of the group).
    IF EXISTS (SELECT 1 FROM ingest_task p WHERE p.parked_at IS NOT NULL AND p.group_key IS NOT NULL) THEN
        -- The table the refill writes is locked for writing before the
        -- statement below reads it (every partition, the DEFAULT one
        -- included): an extension of the outbox partitions takes SHARE on
        -- it and then the DEFAULT partition for its attach, and a refill
        -- that held a read lock of the DEFAULT partition while waiting to
        -- write would close a deadlock with it.
        LOCK TABLE ONLY outbox_row IN ROW EXCLUSIVE MODE;
        WITH ended AS (
            SELECT t.kind, t.group_key, count(*) AS n, min(t.id::text)::uuid AS one
            FROM new_rows r JOIN ingest_task t ON t.id = r.task_id
            WHERE r.from_status = 'RUNNING' AND r.to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED') AND t.group_key IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM ingest_kind k WHERE k.kind = t.kind
                              AND (k.paused OR k.concurrency > 0 OR k.rate_count > 0 OR k.rate_per_group_count > 0))
            GROUP BY t.kind, t.group_key
        ), picked AS (
            SELECT q.id, e.one FROM ended e CROSS JOIN LATERAL (
                SELECT p.id FROM ingest_task p
                WHERE p.kind = e.kind AND p.group_key = e.group_key AND p.parked_at IS NOT NULL AND p.status IN ('QUEUED', 'RETRYING')
                ORDER BY p.id LIMIT e.n
                FOR NO KEY UPDATE SKIP LOCKED) q
        ), woken AS (
            UPDATE ingest_task t SET parked_at = NULL, updated_at = now()
            FROM picked p
            WHERE t.id = p.id AND CASE WHEN t.parked_at IS NOT NULL AND t.status IN ('QUEUED', 'RETRYING') THEN true ELSE false END
            RETURNING t.id, p.one
        )
        -- Each woken task goes to the stream its group's ended run came
        -- from: that run's latest outbox row names it (the stream of its
        -- priority once sent, which the relay routes by the woken task's
        -- own priority).
        SELECT array_agg(w.id ORDER BY w.id),
               array_agg(coalesce((
                   SELECT CASE WHEN o.status = 'SENT' AND coalesce(e.priority, 2) <> 2 AND right(o.stream, 3) = ':p' || e.priority
                               THEN left(o.stream, -3) ELSE o.stream END
                   FROM outbox_row o JOIN ingest_task e ON e.id = o.task_id
                   WHERE o.task_id = w.one ORDER BY o.id DESC LIMIT 1), ingest_task_default_stream()) ORDER BY w.id)
        INTO ids, streams
        FROM woken w;
        IF ids IS NOT NULL THEN
            INSERT INTO outbox_row (task_id, stream, next_retry_at)
            SELECT x.id, x.stream, now() FROM unnest(ids, streams) AS x(id, stream) ORDER BY x.id;
        END IF;
        ids := NULL;
    END IF;

    -- A task cancelled while its sequence predecessor still holds it gives
    -- each successor it holds an edge to that predecessor (one more in
    -- waiting_for), so that the release below of the successor's edge to
    -- the cancelled task leaves it waiting for the task before; across
    -- tasks cancelled together the hold passes from the first one not
    -- cancelled before them to the first one not cancelled after them.
    IF EXISTS (SELECT 1 FROM new_rows r WHERE r.to_status = 'CANCELLED') THEN
        WITH RECURSIVE c AS (
            SELECT DISTINCT r.task_id AS id FROM new_rows r WHERE r.to_status = 'CANCELLED'
        ), up AS (
            SELECT c.id, p.depends_on AS pred
            FROM c JOIN ingest_task_dependency p ON p.task_id = c.id AND p.reason = 'sequence' AND p.released_at IS NULL
        ), root AS (
            SELECT id, pred, 0 AS depth FROM up
            UNION ALL
            SELECT r.id, u.pred, r.depth + 1 FROM root r JOIN up u ON u.id = r.pred WHERE r.depth < 100000
        ), x AS (
            SELECT id, pred FROM root WHERE pred NOT IN (SELECT id FROM c)
        ), moved AS (
            INSERT INTO ingest_task_dependency (task_id, depends_on, reason)
            SELECT s.task_id, x.pred, 'sequence'
            FROM x JOIN ingest_task_dependency s ON s.depends_on = x.id AND s.reason = 'sequence' AND s.released_at IS NULL
            WHERE s.task_id NOT IN (SELECT id FROM c)
            ORDER BY s.task_id
            ON CONFLICT DO NOTHING
            RETURNING task_id
        )
        UPDATE ingest_task t SET waiting_for = coalesce(t.waiting_for, 0) + 1
        FROM moved m WHERE t.id = m.task_id;
    END IF;

    -- The ended tasks that still hold a dependent (one probe of the
    -- depends_on index per ended task) release or cancel them.
    SELECT array_agg(r.task_id), array_agg(r.to_status) INTO ids, ends
    FROM new_rows r
    WHERE r.to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')
      AND EXISTS (SELECT 1 FROM ingest_task_dependency d WHERE d.depends_on = r.task_id AND d.released_at IS NULL);
    IF ids IS NOT NULL THEN
        PERFORM ingest_task_end_edges(ids, ends);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- The table named outbox_event again, and the functions of migrations
-- 00027, 00029 and 00036.
DROP VIEW outbox_event;
ALTER TABLE outbox_row RENAME TO outbox_event;
COMMENT ON TABLE outbox_event IS
    'one row per publication of a task; partitioned by RANGE (id), ranges opened ahead by time: retention drops whole partitions';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_event_partitions()
RETURNS TABLE (name text, lo bigint, hi bigint, is_default boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT b.name, b.lo::bigint, b.hi::bigint, b.is_default
    FROM ingest_partition_bounds('outbox_event') b
    ORDER BY b.is_default, b.hi::bigint NULLS LAST, b.lo::bigint NULLS FIRST;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_event_last_id() RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    last bigint;
BEGIN
    EXECUTE format('SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM %s',
                   pg_get_serial_sequence('outbox_event', 'id')) INTO last;
    RETURN last;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_event_extend(width interval, ahead interval, min_ids bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    last bigint := outbox_event_last_id();
    since_id bigint;
    since_at timestamptz;
    rate float8 := 0;
    young float8 := 0;
    locked boolean := false;
    size bigint;
    reach bigint;
    guard bigint;
    goal bigint;
    lo bigint;
    hi bigint;
    newest text;
    opts text[];
    part text;
    n integer := 0;
BEGIN
    IF width IS NULL OR width <= interval '0' THEN
        RAISE EXCEPTION 'partition width must be positive, not %', width;
    END IF;
    IF min_ids IS NULL OR min_ids < 1 THEN
        RAISE EXCEPTION 'a partition holds at least one id, not %', min_ids;
    END IF;
    SELECT o.id, o.created_at INTO since_id, since_at FROM outbox_event o
    WHERE o.created_at >= now() - width ORDER BY o.created_at LIMIT 1;
    IF since_at < now() - interval '10 seconds' THEN
        rate := greatest(last - since_id, 0) / extract(epoch FROM now() - since_at);
    ELSIF since_at IS NOT NULL THEN
        -- Younger than 10 s: too short a span to size partitions by, but
        -- the guard must not assume no ids are being taken.
        young := greatest(last - since_id, 0) / greatest(extract(epoch FROM now() - since_at), 1);
    END IF;
    size := greatest(min_ids, ceil(rate * extract(epoch FROM width))::bigint);
    reach := greatest(min_ids, ceil(rate * extract(epoch FROM ahead))::bigint);
    guard := greatest(least(reach, greatest(min_ids, ceil(rate * 60)::bigint)), ceil(young * 60)::bigint);
    goal := last + reach;
    SELECT p.name, p.hi INTO newest, hi FROM outbox_event_partitions() p
    WHERE NOT p.is_default AND p.hi IS NOT NULL ORDER BY p.hi DESC LIMIT 1;
    IF hi IS NULL OR hi <= last THEN
        hi := last + 1;
    END IF;
    IF hi < last + guard THEN
        LOCK TABLE ONLY outbox_event IN SHARE MODE;
        locked := true;
        last := outbox_event_last_id();
        goal := last + reach;
        hi := greatest(hi, last + 1);
    END IF;
    SELECT c.reloptions INTO opts FROM pg_class c WHERE c.oid = to_regclass(quote_ident(newest));
    WHILE hi <= goal LOOP
        lo := hi;
        hi := lo + size;
        part := 'outbox_event_from_' || lo;
        EXECUTE format('CREATE TABLE %I (LIKE outbox_event INCLUDING CONSTRAINTS,
                            CONSTRAINT %I CHECK (id >= %s AND id < %s))',
                       part, part || '_bounds', lo, hi);
        IF opts IS NOT NULL THEN
            EXECUTE format('ALTER TABLE %I SET (%s)', part, array_to_string(opts, ', '));
        END IF;
        PERFORM outbox_event_index(part);
        -- The ids taken meanwhile may have come near: then the table is
        -- locked before the attach, as above, and the rows that ids past
        -- lo sent to the DEFAULT partition are moved with the others.
        IF NOT locked AND outbox_event_last_id() + guard >= lo THEN
            LOCK TABLE ONLY outbox_event IN SHARE MODE;
            locked := true;
        END IF;
        -- Rows written with ids of their own past the sequence, or past
        -- lo before the lock.
        IF to_regclass('outbox_event_default') IS NOT NULL THEN
            EXECUTE format('WITH m AS (DELETE FROM outbox_event_default WHERE id >= %s AND id < %s RETURNING *)
                            INSERT INTO %I SELECT * FROM m', lo, hi, part);
        END IF;
        EXECUTE format('ALTER TABLE outbox_event ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)', part, lo, hi);
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', part, part || '_bounds');
        n := n + 1;
    END LOOP;
    RETURN n;
END;
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION outbox_event_extend(interval, interval, bigint) IS
    'creates the partitions of outbox_event, each the ids width of time takes, from the newest one''s end (or the last id taken, under SHARE on the table when ids are within a minute of it) until they reach the ids ahead of time takes; returns how many';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_task_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids uuid[];
    ends text[];
    streams text[];
BEGIN
    -- The scan every statement pays: none ended (a create, a start),
    -- nothing more.
    IF NOT EXISTS (SELECT 1 FROM new_rows r WHERE r.to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')) THEN
        RETURN NULL;
    END IF;
    -- The ended tasks that an awaiter registered announced, 200 ids to a
    -- notification; one probe of an empty table when nobody awaits.
    IF EXISTS (SELECT 1 FROM ingest_task_awaited) THEN
        PERFORM pg_notify('ingest_task_done', string_agg(c.id::text, ','))
        FROM (SELECT r.task_id AS id, (row_number() OVER () - 1) / 200 AS chunk
              FROM new_rows r
              WHERE r.to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')
                AND EXISTS (SELECT 1 FROM ingest_task_awaited a WHERE a.task_id = r.task_id)) c
        GROUP BY c.chunk;
    END IF;

    -- Fair scheduling (package task, group.go): each run of a group that
    -- this statement ended hands its room in the group's window to the
    -- group's oldest parked task at once, so that a busy group's window
    -- stays full without waiting for a release. One probe of
    -- ingest_task_parked_group_idx when no task with a group is parked;
    -- kinds that are paused or limited are left to their releases (the
    -- worker that frees a slot, the leader's releaser), but for a kind
    -- whose only limit is concurrency_per_group: its window is at most
    -- that limit, so a task that takes the room of an ended run of its
    -- group cannot take its group past it (and its start still reserves
    -- a slot of the group).
    IF EXISTS (SELECT 1 FROM ingest_task p WHERE p.parked_at IS NOT NULL AND p.group_key IS NOT NULL) THEN
        -- The table the refill writes is locked for writing before the
        -- statement below reads it (every partition, the DEFAULT one
        -- included): an extension of the outbox partitions takes SHARE on
        -- it and then the DEFAULT partition for its attach, and a refill
        -- that held a read lock of the DEFAULT partition while waiting to
        -- write would close a deadlock with it.
        LOCK TABLE ONLY outbox_event IN ROW EXCLUSIVE MODE;
        WITH ended AS (
            SELECT t.kind, t.group_key, count(*) AS n, min(t.id::text)::uuid AS one
            FROM new_rows r JOIN ingest_task t ON t.id = r.task_id
            WHERE r.from_status = 'RUNNING' AND r.to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED') AND t.group_key IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM ingest_kind k WHERE k.kind = t.kind
                              AND (k.paused OR k.concurrency > 0 OR k.rate_count > 0 OR k.rate_per_group_count > 0))
            GROUP BY t.kind, t.group_key
        ), picked AS (
            SELECT q.id, e.one FROM ended e CROSS JOIN LATERAL (
                SELECT p.id FROM ingest_task p
                WHERE p.kind = e.kind AND p.group_key = e.group_key AND p.parked_at IS NOT NULL AND p.status IN ('QUEUED', 'RETRYING')
                ORDER BY p.id LIMIT e.n
                FOR NO KEY UPDATE SKIP LOCKED) q
        ), woken AS (
            UPDATE ingest_task t SET parked_at = NULL, updated_at = now()
            FROM picked p
            WHERE t.id = p.id AND CASE WHEN t.parked_at IS NOT NULL AND t.status IN ('QUEUED', 'RETRYING') THEN true ELSE false END
            RETURNING t.id, p.one
        )
        -- Each woken task goes to the stream its group's ended run came
        -- from: that run's latest outbox row names it (the stream of its
        -- priority once sent, which the relay routes by the woken task's
        -- own priority).
        SELECT array_agg(w.id ORDER BY w.id),
               array_agg(coalesce((
                   SELECT CASE WHEN o.status = 'SENT' AND coalesce(e.priority, 2) <> 2 AND right(o.stream, 3) = ':p' || e.priority
                               THEN left(o.stream, -3) ELSE o.stream END
                   FROM outbox_event o JOIN ingest_task e ON e.id = o.task_id
                   WHERE o.task_id = w.one ORDER BY o.id DESC LIMIT 1), ingest_task_default_stream()) ORDER BY w.id)
        INTO ids, streams
        FROM woken w;
        IF ids IS NOT NULL THEN
            INSERT INTO outbox_event (task_id, stream, next_retry_at)
            SELECT x.id, x.stream, now() FROM unnest(ids, streams) AS x(id, stream) ORDER BY x.id;
        END IF;
        ids := NULL;
    END IF;

    -- A task cancelled while its sequence predecessor still holds it gives
    -- each successor it holds an edge to that predecessor (one more in
    -- waiting_for), so that the release below of the successor's edge to
    -- the cancelled task leaves it waiting for the task before; across
    -- tasks cancelled together the hold passes from the first one not
    -- cancelled before them to the first one not cancelled after them.
    IF EXISTS (SELECT 1 FROM new_rows r WHERE r.to_status = 'CANCELLED') THEN
        WITH RECURSIVE c AS (
            SELECT DISTINCT r.task_id AS id FROM new_rows r WHERE r.to_status = 'CANCELLED'
        ), up AS (
            SELECT c.id, p.depends_on AS pred
            FROM c JOIN ingest_task_dependency p ON p.task_id = c.id AND p.reason = 'sequence' AND p.released_at IS NULL
        ), root AS (
            SELECT id, pred, 0 AS depth FROM up
            UNION ALL
            SELECT r.id, u.pred, r.depth + 1 FROM root r JOIN up u ON u.id = r.pred WHERE r.depth < 100000
        ), x AS (
            SELECT id, pred FROM root WHERE pred NOT IN (SELECT id FROM c)
        ), moved AS (
            INSERT INTO ingest_task_dependency (task_id, depends_on, reason)
            SELECT s.task_id, x.pred, 'sequence'
            FROM x JOIN ingest_task_dependency s ON s.depends_on = x.id AND s.reason = 'sequence' AND s.released_at IS NULL
            WHERE s.task_id NOT IN (SELECT id FROM c)
            ORDER BY s.task_id
            ON CONFLICT DO NOTHING
            RETURNING task_id
        )
        UPDATE ingest_task t SET waiting_for = coalesce(t.waiting_for, 0) + 1
        FROM moved m WHERE t.id = m.task_id;
    END IF;

    -- The ended tasks that still hold a dependent (one probe of the
    -- depends_on index per ended task) release or cancel them.
    SELECT array_agg(r.task_id), array_agg(r.to_status) INTO ids, ends
    FROM new_rows r
    WHERE r.to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')
      AND EXISTS (SELECT 1 FROM ingest_task_dependency d WHERE d.depends_on = r.task_id AND d.released_at IS NULL);
    IF ids IS NOT NULL THEN
        PERFORM ingest_task_end_edges(ids, ends);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
