-- +goose Up
-- The default path's write set and trigger work, smaller (docs/ARCHITECTURE.md
-- §3.3, §3.5).
--
-- 1. started_from: the state the latest start of the task left (QUEUED,
--    RETRYING, or RUNNING for a takeover), written by the start itself
--    (task/transitions.go: startSQL, "started_from = t.status": the SET
--    list of an UPDATE reads the row version it replaces) and returned to
--    name the audit row's from_status. Before it, the start locked its
--    rows first to read that state (a lock is a WAL record of its own and
--    a pass over the rows); now the start is one guarded UPDATE, as the
--    completions are. A scratch column: nothing else reads it, and no index
--    names it, so the start stays a HOT update. Nullable without a default:
--    only the catalog changes.
ALTER TABLE ingest_task ADD COLUMN started_from text;
COMMENT ON COLUMN ingest_task.started_from IS 'the state the latest start left (written and read by the start only); NULL: never started';

-- 2. One statement trigger on the audit table instead of three (migrations
--    00017, 00018 and 00020: the done notification, the dependency release
--    and the sequence pass-on), each of which called a function and
--    scanned the statement's transition table, on every audit insert: the
--    creates and starts too, which end no task. ingest_task_ended is one
--    call; its first scan of the transition table, for the rows that end a
--    task (SUCCEEDED, DEAD, CANCELLED), announces them on ingest_task_done,
--    200 ids to a notification (as 00017 did), and it returns at once when
--    there are none. Otherwise, in this order:
--    * when some were CANCELLED: pass a cancelled task's sequence hold on
--      to its successors (as 00020's trigger did), before
--    * the release or cancel of the dependents of the ended tasks that
--      have an unreleased edge (ingest_task_end_edges, as 00018's trigger
--      called it).
-- +goose StatementBegin
CREATE FUNCTION ingest_task_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids uuid[];
    ends text[];
BEGIN
    -- The scan every statement pays: the ended tasks announced, 200 ids
    -- to a notification; none found (a create, a start), nothing more.
    PERFORM pg_notify('ingest_task_done', string_agg(c.id::text, ','))
    FROM (SELECT r.task_id AS id, (row_number() OVER () - 1) / 200 AS chunk
          FROM new_rows r WHERE r.to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')) c
    GROUP BY c.chunk;
    IF NOT FOUND THEN
        RETURN NULL;
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
DROP TRIGGER ingest_task_done_notify ON ingest_task_transition;
DROP TRIGGER ingest_task_pass_on_sequence ON ingest_task_transition;
DROP TRIGGER ingest_task_release_dependents ON ingest_task_transition;
DROP FUNCTION ingest_task_done_notify();
DROP FUNCTION ingest_task_pass_on_sequence();
DROP FUNCTION ingest_task_release_dependents();
CREATE TRIGGER ingest_task_ended AFTER INSERT ON ingest_task_transition
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION ingest_task_ended();

-- +goose Down
DROP TRIGGER ingest_task_ended ON ingest_task_transition;
DROP FUNCTION ingest_task_ended();
-- The three triggers of migrations 00017, 00018 and 00020 again.
-- +goose StatementBegin
CREATE FUNCTION ingest_task_done_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ingest_task_done', string_agg(id::text, ','))
    FROM (SELECT task_id AS id, (row_number() OVER ()) / 200 AS chunk
          FROM new_rows WHERE to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')) d
    GROUP BY chunk;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER ingest_task_done_notify AFTER INSERT ON ingest_task_transition
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION ingest_task_done_notify();
-- +goose StatementBegin
CREATE FUNCTION ingest_task_release_dependents() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids uuid[];
    ends text[];
BEGIN
    SELECT array_agg(n.task_id), array_agg(n.to_status) INTO ids, ends
    FROM new_rows n
    WHERE n.to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')
      AND EXISTS (SELECT 1 FROM ingest_task_dependency e WHERE e.depends_on = n.task_id AND e.released_at IS NULL);
    IF ids IS NOT NULL THEN
        PERFORM ingest_task_end_edges(ids, ends);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER ingest_task_release_dependents AFTER INSERT ON ingest_task_transition
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION ingest_task_release_dependents();
-- +goose StatementBegin
CREATE FUNCTION ingest_task_pass_on_sequence() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH RECURSIVE c AS (
        SELECT DISTINCT task_id AS id FROM new_rows WHERE to_status = 'CANCELLED'
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
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER ingest_task_pass_on_sequence AFTER INSERT ON ingest_task_transition
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION ingest_task_pass_on_sequence();
ALTER TABLE ingest_task DROP COLUMN started_from;
