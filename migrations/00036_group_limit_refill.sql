-- +goose Up
-- The statement that ends a run refills its group's window for a kind
-- whose only limit is concurrency_per_group too (docs/FAIRNESS.md, "Fair
-- scheduling"): such a kind's window refilled only through the worker's
-- free of the run's slot and the release after it (several round trips
-- and the kind's release lock), so a busy group's window stayed partly
-- empty even where the limit never bound (a burst of 3,600 tasks on three
-- workers took 6.6-8.1 s, 5.1-6.4 s with this refill, 1.9-2.1 s without
-- the limit: docs/PERFORMANCE.md). The window is at most the limit
-- (migration 00035), so the room an ended run leaves never takes its
-- group past it, and each start still reserves the group's slot. Kinds
-- that are paused or have a concurrency or rate limit of their own, or a
-- rate per group, are left to their releases as before.
--
-- The refill also takes its write lock of outbox_event before it reads
-- the table: it read it first (for the stream of the group's ended run),
-- and an extension of the outbox partitions (outbox_event_extend: SHARE
-- on the table, then the DEFAULT partition for the attach) deadlocked
-- with the completions that were refilling windows at that moment.
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

-- +goose Down
-- The body of migration 00034.
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
    -- worker that frees a slot, the leader's releaser).
    IF EXISTS (SELECT 1 FROM ingest_task p WHERE p.parked_at IS NOT NULL AND p.group_key IS NOT NULL) THEN
        WITH ended AS (
            SELECT t.kind, t.group_key, count(*) AS n, min(t.id::text)::uuid AS one
            FROM new_rows r JOIN ingest_task t ON t.id = r.task_id
            WHERE r.from_status = 'RUNNING' AND r.to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED') AND t.group_key IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM ingest_kind k WHERE k.kind = t.kind
                              AND (k.paused OR k.concurrency > 0 OR k.rate_count > 0 OR k.concurrency_per_group > 0 OR k.rate_per_group_count > 0))
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
