-- +goose Up
-- Dependencies between tasks (package task, docs/PIPELINES.md): a task may
-- wait for other tasks to end before it runs.
--
-- ingest_task.waiting_for: the edges of this task not yet released (its
-- dependencies and a sequence predecessor); NULL or 0: free to run. A
-- task with waiting_for > 0 is QUEUED but held: the start guard refuses
-- it, and its release publishes it.
-- ingest_task.on_dependency_failure: what a dependency that ends DEAD or
-- CANCELLED does to this task: 'cancel' (NULL means it) or 'run'.
-- ingest_task.workflow_id: the pipeline the task belongs to, the id of its
-- root task (a task with dependents but no dependencies), inherited by its
-- dependents; NULL: not in one.
-- ingest_task.dependency_depth: the length of the longest chain of
-- dependencies above the task (NULL: none), kept below the depth limit.
--
-- Nullable without a default: only the catalog changes (no table rewrite).
-- No index but the workflow one names them, and that one only indexes
-- rows with a workflow_id, which no update changes, so a start stays a
-- HOT update (migration 00012).
ALTER TABLE ingest_task
    ADD COLUMN waiting_for int,
    ADD COLUMN on_dependency_failure text
        CHECK (on_dependency_failure IN ('cancel', 'run')),
    ADD COLUMN workflow_id uuid,
    ADD COLUMN dependency_depth int;
COMMENT ON COLUMN ingest_task.waiting_for IS 'edges of this task not yet released; NULL or 0: free to run';
COMMENT ON COLUMN ingest_task.on_dependency_failure IS 'cancel (NULL) or run: what a dependency ending DEAD or CANCELLED does to this task';
COMMENT ON COLUMN ingest_task.workflow_id IS 'the id of the root task of the pipeline the task belongs to; NULL: none';

-- One row per edge: task_id waits for depends_on to end. reason
-- 'dependency' is a create's depends_on; 'sequence' points at the previous
-- task of the same kind and sequence key. released_at: when the end of
-- depends_on released task_id from this edge; NULL: still holding.
CREATE TABLE ingest_task_dependency (
    task_id     uuid NOT NULL,
    depends_on  uuid NOT NULL,
    reason      text NOT NULL DEFAULT 'dependency'
                CHECK (reason IN ('dependency', 'sequence')),
    released_at timestamptz,
    PRIMARY KEY (task_id, depends_on),
    CHECK (task_id <> depends_on)
);
CREATE INDEX ingest_task_dependency_depends_on_idx ON ingest_task_dependency (depends_on);
CREATE INDEX ingest_task_workflow_idx ON ingest_task (workflow_id, created_at, id)
    WHERE workflow_id IS NOT NULL;

-- A held task (waiting_for > 0) is created with one outbox row held back,
-- due at HeldUntil (9999-12-31): the relay never claims it and the rescuer
-- leaves a task with an unsent row alone. Its release replaces that row
-- with a fresh one to the same stream, due at once (or at the task's own
-- later due time): the INSERT's NOTIFY wakes the relay, and the task is
-- published like a fresh create.

-- ingest_sequence_continues(kind) is whether a DEAD task of kind releases
-- the next task of its sequence key (the kind's sequence_on_failure is
-- 'continue') instead of blocking the key. THE ONE PLACE that decides the
-- DEAD case of a 'sequence' edge: a later migration that gives kinds that
-- setting replaces this function (CREATE OR REPLACE). Until then: block.
-- +goose StatementBegin
CREATE FUNCTION ingest_sequence_continues(kind text) RETURNS boolean
LANGUAGE sql STABLE AS $$ SELECT false $$;
-- +goose StatementEnd

-- ingest_task_default_stream() is the stream of a released task that has
-- no held outbox row: the one ingest_enqueue_batch publishes to (its
-- setting ingest.stream, docs/SQL-ENQUEUE.md), else 'ingest:tasks'.
-- +goose StatementBegin
CREATE FUNCTION ingest_task_default_stream() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT substr(x, 15) FROM pg_proc p, unnest(p.proconfig) AS x
                     WHERE p.proname = 'ingest_enqueue_batch' AND x LIKE 'ingest.stream=%' LIMIT 1),
                    'ingest:tasks')
$$;
-- +goose StatementEnd

-- ingest_task_end_edges(ids, ends) applies the end of the tasks ids (ends
-- holds each one's end: SUCCEEDED, DEAD, CANCELLED, or DELETED) to the
-- edges that hold their dependents, in the transaction that ended them:
--
-- * An edge is released (released_at = now(), the dependent's waiting_for
--   one lower) when its dependency SUCCEEDED or was deleted; a
--   'dependency' edge also when the dependency ended DEAD or CANCELLED and
--   the dependent's on_dependency_failure is 'run'; a 'sequence' edge also
--   when the dependency was CANCELLED, or ended DEAD and
--   ingest_sequence_continues(kind).
-- * A QUEUED dependent whose 'dependency' edge ends DEAD or CANCELLED under
--   the policy 'cancel' (or NULL) goes CANCELLED, with its audit row (the
--   message names the dependency and its end; worker 'dependency'); its
--   held outbox row is deleted; its edge stays unreleased (a redrive of
--   the dependency with its dependents revives it). Its audit row ends it
--   in turn, so its own dependents follow, in the same transaction.
-- * Otherwise the edge holds (a DEAD sequence predecessor blocks its key;
--   its redrive and success release it).
-- * A QUEUED dependent whose waiting_for reaches 0 gets its outbox row:
--   its held row (or rows) are replaced by one to the same stream, due at
--   once (or at its own next_retry_at when that is later); due_at is set
--   to when it became due.
--
-- The dependents are locked in id order first, so that two statements
-- ending tasks with common dependents do not deadlock.
-- +goose StatementBegin
CREATE FUNCTION ingest_task_end_edges(ids uuid[], ends text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM ingest_task t
    WHERE t.id IN (SELECT e.task_id FROM ingest_task_dependency e
                   WHERE e.depends_on = ANY(ids) AND e.released_at IS NULL)
    ORDER BY t.id FOR NO KEY UPDATE;

    WITH ended AS (
        SELECT DISTINCT ON (d.id) d.id, d.end_state FROM unnest(ids, ends) AS d(id, end_state) ORDER BY d.id
    ), rel AS (
        UPDATE ingest_task_dependency e SET released_at = now()
        FROM ended d, ingest_task t
        WHERE e.depends_on = d.id AND e.released_at IS NULL AND t.id = e.task_id
          AND (d.end_state IN ('SUCCEEDED', 'DELETED')
               OR (e.reason = 'dependency' AND t.on_dependency_failure = 'run')
               OR (e.reason = 'sequence' AND (d.end_state = 'CANCELLED'
                   -- the DEAD case of a 'sequence' edge: ingest_sequence_continues
                   OR (d.end_state = 'DEAD' AND ingest_sequence_continues(t.kind)))))
        RETURNING e.task_id
    ), n AS (
        SELECT task_id, count(*)::int AS n FROM rel GROUP BY task_id
    ), upd AS (
        UPDATE ingest_task t SET waiting_for = greatest(t.waiting_for - n.n, 0), updated_at = now(),
            due_at = CASE WHEN t.waiting_for - n.n <= 0 THEN greatest(now(), coalesce(t.next_retry_at, now())) ELSE t.due_at END
        FROM n WHERE t.id = n.task_id AND t.status = 'QUEUED' AND t.waiting_for > 0
        RETURNING t.id, t.waiting_for, t.next_retry_at
    ), freed AS (
        SELECT id, next_retry_at FROM upd WHERE waiting_for = 0
    ), held AS (
        DELETE FROM outbox_event o USING freed f
        WHERE o.task_id = f.id AND o.status IN ('NEW', 'RETRYING')
        RETURNING o.task_id, o.stream
    )
    INSERT INTO outbox_event (task_id, stream, next_retry_at)
    SELECT f.id, coalesce((SELECT h.stream FROM held h WHERE h.task_id = f.id LIMIT 1), ingest_task_default_stream()),
           greatest(now(), coalesce(f.next_retry_at, now()))
    FROM freed f ORDER BY f.id;

    WITH ended AS (
        SELECT DISTINCT ON (d.id) d.id, d.end_state FROM unnest(ids, ends) AS d(id, end_state) ORDER BY d.id
    ), victim AS (
        SELECT DISTINCT ON (e.task_id) e.task_id, d.id AS dep, d.end_state
        FROM ended d JOIN ingest_task_dependency e ON e.depends_on = d.id
        WHERE e.released_at IS NULL AND e.reason = 'dependency' AND d.end_state IN ('DEAD', 'CANCELLED')
        ORDER BY e.task_id, d.id
    ), c AS (
        UPDATE ingest_task t SET status = 'CANCELLED', finished_at = now(), next_retry_at = NULL, parked_at = NULL,
            cancel_requested_at = now(), cancel_requested_by = 'dependency',
            cancel_reason = 'dependency ' || v.dep || ' ended ' || v.end_state, updated_at = now()
        FROM victim v
        WHERE t.id = v.task_id AND t.status = 'QUEUED' AND coalesce(t.on_dependency_failure, 'cancel') = 'cancel'
        RETURNING t.id, t.attempt_count, t.cancel_reason
    ), gone AS (
        DELETE FROM outbox_event o USING c WHERE o.task_id = c.id AND o.status IN ('NEW', 'RETRYING')
    )
    INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, message, worker)
    SELECT id, 'QUEUED', 'CANCELLED', attempt_count, 'cancelled: ' || cancel_reason, 'dependency' FROM c ORDER BY id;
END;
$$;
-- +goose StatementEnd

-- Every end of a task writes its audit row (package task), so a statement
-- trigger on the audit table sees every path: completions, takeovers to
-- DEAD, cancels (and the cancels above, which cascade). One call per
-- statement; a statement that ends no task, or ends tasks without
-- dependents, costs one probe of the depends_on index per ended task.
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

-- A deleted task (only terminal ones are deleted: by id, or by retention)
-- releases the edges it still holds (a DEAD sequence predecessor), and its
-- own edges go with it.
-- +goose StatementBegin
CREATE FUNCTION ingest_task_release_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids uuid[];
BEGIN
    DELETE FROM ingest_task_dependency e USING old_rows o WHERE e.task_id = o.id;
    SELECT array_agg(o.id) INTO ids FROM old_rows o
    WHERE EXISTS (SELECT 1 FROM ingest_task_dependency e WHERE e.depends_on = o.id AND e.released_at IS NULL);
    IF ids IS NOT NULL THEN
        PERFORM ingest_task_end_edges(ids, array_fill('DELETED'::text, ARRAY[cardinality(ids)]));
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER ingest_task_release_deleted AFTER DELETE ON ingest_task
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION ingest_task_release_deleted();

-- +goose Down
DROP TRIGGER ingest_task_release_deleted ON ingest_task;
DROP FUNCTION ingest_task_release_deleted();
DROP TRIGGER ingest_task_release_dependents ON ingest_task_transition;
DROP FUNCTION ingest_task_release_dependents();
DROP FUNCTION ingest_task_end_edges(uuid[], text[]);
DROP FUNCTION ingest_task_default_stream();
DROP FUNCTION ingest_sequence_continues(text);
DROP INDEX ingest_task_workflow_idx;
DROP TABLE ingest_task_dependency;
ALTER TABLE ingest_task
    DROP COLUMN dependency_depth,
    DROP COLUMN workflow_id,
    DROP COLUMN on_dependency_failure,
    DROP COLUMN waiting_for;
