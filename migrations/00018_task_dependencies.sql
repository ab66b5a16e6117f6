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

-- Dependencies from SQL (docs/SQL-ENQUEUE.md): ingest_enqueue and
-- ingest_enqueue_batch take depends_on (ids of existing tasks) and
-- on_dependency_failure, as POST /v1/tasks does. They take the two fields
-- off each task, create the tasks as before (ingest_enqueue_tasks,
-- unchanged), then ingest_enqueue_link adds the edges of the tasks this
-- call created, with the checks and effects of the Go store
-- (task/deps.go: linkDependencies). A ref (an item of the same batch) is
-- refused: create the dependencies first, or use the Go store or POST
-- /v1/tasks:batch.
-- +goose StatementBegin
CREATE FUNCTION ingest_enqueue_link(ids uuid[], tasks jsonb, numbered boolean) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    uuid_re constant text := '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$';
    max_deps constant int := 1000;
    max_depth constant int := 100;
    held_until constant timestamptz := '9999-12-31 00:00:00+00';
    el jsonb;
    v jsonb;
    t text;
    pre text;
    e_from uuid[] := '{}';
    e_to uuid[] := '{}';
    e_pos int[] := '{}';
    dependents uuid[] := '{}';
    policies text[] := '{}';
    missing record;
    deep record;
    ended uuid[];
    ends text[];
BEGIN
    IF jsonb_typeof(tasks) <> 'array' THEN
        RETURN;
    END IF;
    FOR pos IN 0 .. jsonb_array_length(tasks) - 1 LOOP
        el := tasks->pos;
        CONTINUE WHEN jsonb_typeof(el) <> 'object';
        pre := CASE WHEN numbered THEN format('task %s: ', pos) ELSE '' END;
        IF coalesce(jsonb_typeof(el->'ref'), 'null') <> 'null' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'ref',
                MESSAGE = pre || 'ref is not taken from SQL: depends_on names existing tasks by id',
                HINT = 'create the dependencies first, or create the graph with POST /v1/tasks:batch';
        END IF;
        v := el->'on_dependency_failure';
        t := jsonb_typeof(v);
        IF coalesce(t, 'null') <> 'null' AND (t <> 'string' OR v->>0 NOT IN ('', 'cancel', 'run')) THEN
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'on_dependency_failure',
                MESSAGE = pre || CASE WHEN t <> 'string' THEN format('on_dependency_failure must be a JSON string, got %s', t)
                    ELSE format('on_dependency_failure must be "cancel" or "run", got "%s"', ingest_enqueue_clip(v->>0, 64)) END;
        END IF;
        v := el->'depends_on';
        t := jsonb_typeof(v);
        CONTINUE WHEN coalesce(t, 'null') = 'null';
        IF t <> 'array' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'depends_on',
                MESSAGE = pre || format('depends_on must be a JSON array of task ids, got %s', t);
        END IF;
        IF jsonb_array_length(v) > max_deps THEN
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'depends_on',
                MESSAGE = pre || format('depends_on has %s dependencies, the limit is %s', jsonb_array_length(v), max_deps);
        END IF;
        SELECT x INTO t FROM jsonb_array_elements(v) AS x
        WHERE jsonb_typeof(x) <> 'string' OR x->>0 !~ uuid_re LIMIT 1;
        IF t IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'depends_on',
                MESSAGE = pre || format('depends_on %s is not a task id', ingest_enqueue_clip(t, 64));
        END IF;
        CONTINUE WHEN jsonb_array_length(v) = 0;
        -- Only a task this call created gets edges (an idempotency key or
        -- the payload dedup that found an existing task keeps its own).
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM ingest_task k WHERE k.id = ids[pos + 1]
            AND k.created_at = now() AND k.waiting_for IS NULL
            AND NOT EXISTS (SELECT 1 FROM ingest_task_dependency d WHERE d.task_id = k.id))
            OR ids[pos + 1] = ANY(dependents);
        dependents := dependents || ids[pos + 1];
        policies := policies || NULLIF(el->>'on_dependency_failure', '');
        e_from := e_from || array_fill(ids[pos + 1], ARRAY[jsonb_array_length(v)]);
        e_to := e_to || ARRAY(SELECT (x->>0)::uuid FROM jsonb_array_elements(v) WITH ORDINALITY AS a(x, o) ORDER BY o);
        e_pos := e_pos || array_fill(pos, ARRAY[jsonb_array_length(v)]);
    END LOOP;
    IF cardinality(dependents) = 0 THEN
        RETURN;
    END IF;

    -- The dependencies, locked in id order (their ends wait for this
    -- transaction, so they see the edges): each must exist.
    PERFORM 1 FROM ingest_task WHERE id IN (SELECT unnest(e_to)) ORDER BY id FOR NO KEY UPDATE;
    SELECT e.to_id, e.pos INTO missing FROM unnest(e_to, e_pos) AS e(to_id, pos)
    WHERE NOT EXISTS (SELECT 1 FROM ingest_task k WHERE k.id = e.to_id) ORDER BY e.pos LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'depends_on',
            MESSAGE = CASE WHEN numbered THEN format('task %s: ', missing.pos) ELSE '' END
                || format('depends_on: no task %s (unknown or deleted)', missing.to_id);
    END IF;
    SELECT e.pos, 1 + max(coalesce(k.dependency_depth, 0)) AS d INTO deep
    FROM unnest(e_to, e_pos) AS e(to_id, pos) JOIN ingest_task k ON k.id = e.to_id
    GROUP BY e.pos HAVING 1 + max(coalesce(k.dependency_depth, 0)) > max_depth ORDER BY e.pos LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'depends_on',
            MESSAGE = CASE WHEN numbered THEN format('task %s: ', deep.pos) ELSE '' END
                || format('depends_on: the task would be %s dependencies deep, the limit is %s', deep.d, max_depth);
    END IF;

    INSERT INTO ingest_task_dependency (task_id, depends_on)
    SELECT DISTINCT f, t2 FROM unnest(e_from, e_to) AS e(f, t2);
    -- A dependency in no workflow is the root of its own.
    UPDATE ingest_task SET workflow_id = id
    WHERE id IN (SELECT unnest(e_to)) AND workflow_id IS NULL;
    UPDATE ingest_task k SET waiting_for = x.n, on_dependency_failure = x.p, dependency_depth = x.d, workflow_id = x.w
    FROM (SELECT dep.id, dep.p,
                 (SELECT count(DISTINCT e.t2) FROM unnest(e_from, e_to) AS e(f, t2) WHERE e.f = dep.id) AS n,
                 (SELECT 1 + max(coalesce(d.dependency_depth, 0)) FROM unnest(e_from, e_to) AS e(f, t2)
                    JOIN ingest_task d ON d.id = e.t2 WHERE e.f = dep.id) AS d,
                 (SELECT d.workflow_id FROM unnest(e_from, e_to) WITH ORDINALITY AS e(f, t2, o)
                    JOIN ingest_task d ON d.id = e.t2 WHERE e.f = dep.id ORDER BY e.o LIMIT 1) AS w
          FROM unnest(dependents, policies) AS dep(id, p)) x
    WHERE k.id = x.id;
    -- Held: the row ingest_enqueue_tasks wrote waits for the release.
    UPDATE outbox_event SET next_retry_at = held_until
    WHERE task_id = ANY(dependents) AND status IN ('NEW', 'RETRYING');
    -- Dependencies that ended already apply at once.
    SELECT array_agg(k.id), array_agg(k.status) INTO ended, ends FROM ingest_task k
    WHERE k.id IN (SELECT unnest(e_to)) AND k.status IN ('SUCCEEDED', 'DEAD', 'CANCELLED');
    IF ended IS NOT NULL THEN
        PERFORM ingest_task_end_edges(ended, ends);
    END IF;
END;
$$;
-- +goose StatementEnd

-- ingest_enqueue_strip(tasks) is tasks without the fields ingest_enqueue_link
-- reads (ingest_enqueue_tasks refuses unknown fields).
-- +goose StatementBegin
CREATE FUNCTION ingest_enqueue_strip(tasks jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(tasks) = 'array' THEN coalesce(
        (SELECT jsonb_agg(CASE WHEN jsonb_typeof(e) = 'object' THEN e - ARRAY['depends_on', 'on_dependency_failure', 'ref'] ELSE e END ORDER BY o)
         FROM jsonb_array_elements(tasks) WITH ORDINALITY AS x(e, o)), '[]'::jsonb)
    ELSE tasks END
$$;
-- +goose StatementEnd

-- ingest_enqueue_after(ids, tasks, numbered) is what the entry points do
-- with the tasks ingest_enqueue_tasks created from tasks: link their
-- dependencies. A later migration that adds a step replaces this function
-- alone, not the entry points (whose settings and grants it would have to
-- carry over).
-- +goose StatementBegin
CREATE FUNCTION ingest_enqueue_after(ids uuid[], tasks jsonb, numbered boolean) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM ingest_enqueue_link(ids, tasks, numbered);
END;
$$;
-- +goose StatementEnd

-- ingest_enqueue_reset(fn, setting) sets again on fn one entry of a
-- function's proconfig ("name=value", as pg_proc keeps it): a list
-- (search_path) as written, any other value as a literal.
-- +goose StatementBegin
CREATE FUNCTION ingest_enqueue_reset(fn text, setting text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('ALTER FUNCTION %s SET %s = %s', fn, split_part(setting, '=', 1),
        CASE WHEN split_part(setting, '=', 1) = 'search_path' THEN substr(setting, strpos(setting, '=') + 1)
             ELSE quote_literal(substr(setting, strpos(setting, '=') + 1)) END)
$$;
-- +goose StatementEnd

-- The two entry points, replaced in place: their owner, grants and
-- settings (ingest.stream, ingest.max_payload_bytes, which CREATE OR
-- REPLACE would reset) are kept.
-- +goose StatementBegin
DO $do$
DECLARE
    cfg text[];
    cfg1 text[];
    x text;
BEGIN
    SELECT proconfig INTO cfg FROM pg_proc WHERE oid = 'ingest_enqueue_batch(jsonb)'::regprocedure;
    SELECT proconfig INTO cfg1 FROM pg_proc WHERE oid = 'ingest_enqueue(text, jsonb, jsonb)'::regprocedure;
    CREATE OR REPLACE FUNCTION ingest_enqueue_batch(tasks jsonb) RETURNS uuid[]
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET ingest.stream = 'ingest:tasks'
    SET ingest.max_payload_bytes = '1048576'
    AS $fn$
    DECLARE
        ids uuid[];
    BEGIN
        ids := ingest_enqueue_tasks(ingest_enqueue_strip(tasks), true);
        PERFORM ingest_enqueue_after(ids, tasks, true);
        RETURN ids;
    END;
    $fn$;
    FOREACH x IN ARRAY coalesce(cfg, '{}') LOOP
        EXECUTE ingest_enqueue_reset('ingest_enqueue_batch(jsonb)', x);
    END LOOP;

    CREATE OR REPLACE FUNCTION ingest_enqueue(kind text, payload jsonb, options jsonb DEFAULT '{}') RETURNS uuid
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $fn$
    DECLARE
        opts jsonb := coalesce(options, '{}');
        bad text;
        task jsonb;
        id uuid;
    BEGIN
        IF jsonb_typeof(opts) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'options',
                MESSAGE = format('options must be a JSON object, got %s', jsonb_typeof(opts));
        END IF;
        IF opts ? 'kind' OR opts ? 'payload' THEN
            bad := CASE WHEN opts ? 'kind' THEN 'kind' ELSE 'payload' END;
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = bad,
                MESSAGE = format('unknown field "%s"', bad),
                HINT = 'kind and payload are arguments of ingest_enqueue, not options';
        END IF;
        task := jsonb_build_array(opts || jsonb_build_object('kind', kind, 'payload', coalesce(payload, 'null'::jsonb)));
        id := (ingest_enqueue_tasks(ingest_enqueue_strip(task), false))[1];
        PERFORM ingest_enqueue_after(ARRAY[id], task, false);
        RETURN id;
    END;
    $fn$;
    FOREACH x IN ARRAY coalesce(cfg1, '{}') LOOP
        EXECUTE ingest_enqueue_reset('ingest_enqueue(text, jsonb, jsonb)', x);
    END LOOP;
END;
$do$;
-- +goose StatementEnd

-- None of these is for the public: the release functions change tasks;
-- the entry points call the others as their owner.
REVOKE EXECUTE ON FUNCTION ingest_sequence_continues(text), ingest_task_default_stream(),
    ingest_task_end_edges(uuid[], text[]), ingest_enqueue_link(uuid[], jsonb, boolean),
    ingest_enqueue_after(uuid[], jsonb, boolean), ingest_enqueue_strip(jsonb), ingest_enqueue_reset(text, text) FROM PUBLIC;

-- +goose Down
-- The entry points of migration 00016 again (settings and grants kept).
-- +goose StatementBegin
DO $do$
DECLARE
    cfg text[];
    cfg1 text[];
    x text;
BEGIN
    SELECT proconfig INTO cfg FROM pg_proc WHERE oid = 'ingest_enqueue_batch(jsonb)'::regprocedure;
    SELECT proconfig INTO cfg1 FROM pg_proc WHERE oid = 'ingest_enqueue(text, jsonb, jsonb)'::regprocedure;
    CREATE OR REPLACE FUNCTION ingest_enqueue_batch(tasks jsonb) RETURNS uuid[]
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET ingest.stream = 'ingest:tasks'
    SET ingest.max_payload_bytes = '1048576'
    AS $fn$
    BEGIN
        RETURN ingest_enqueue_tasks(tasks, true);
    END;
    $fn$;
    FOREACH x IN ARRAY coalesce(cfg, '{}') LOOP
        EXECUTE ingest_enqueue_reset('ingest_enqueue_batch(jsonb)', x);
    END LOOP;

    CREATE OR REPLACE FUNCTION ingest_enqueue(kind text, payload jsonb, options jsonb DEFAULT '{}') RETURNS uuid
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $fn$
    DECLARE
        opts jsonb := coalesce(options, '{}');
        bad text;
    BEGIN
        IF jsonb_typeof(opts) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'options',
                MESSAGE = format('options must be a JSON object, got %s', jsonb_typeof(opts));
        END IF;
        IF opts ? 'kind' OR opts ? 'payload' THEN
            bad := CASE WHEN opts ? 'kind' THEN 'kind' ELSE 'payload' END;
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = bad,
                MESSAGE = format('unknown field "%s"', bad),
                HINT = 'kind and payload are arguments of ingest_enqueue, not options';
        END IF;
        RETURN (ingest_enqueue_tasks(
            jsonb_build_array(opts || jsonb_build_object('kind', kind, 'payload', coalesce(payload, 'null'::jsonb))), false))[1];
    END;
    $fn$;
    FOREACH x IN ARRAY coalesce(cfg1, '{}') LOOP
        EXECUTE ingest_enqueue_reset('ingest_enqueue(text, jsonb, jsonb)', x);
    END LOOP;
END;
$do$;
-- +goose StatementEnd
DROP FUNCTION ingest_enqueue_strip(jsonb);
DROP FUNCTION ingest_enqueue_after(uuid[], jsonb, boolean);
DROP FUNCTION ingest_enqueue_link(uuid[], jsonb, boolean);
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
DROP FUNCTION ingest_enqueue_reset(text, text);
