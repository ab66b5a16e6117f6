-- +goose Up
-- The SQL create and a group's window for tasks that wait for an edge
-- (docs/FAIRNESS.md; task/group.go holdBack).
--
-- The Go store leaves a task that will wait for an edge (its dependencies,
-- or an earlier task of its sequence) out of its group's window when it
-- creates it: the task takes no room and is never created parked, and the
-- relay holds it to the window once the edge releases it (migration
-- 00032). The SQL entry points (ingest_enqueue, ingest_enqueue_batch) link
-- the edges after their body (ingest_enqueue_tasks) has decided the
-- windows, so until now the body counted such a task as due now: it could
-- create it parked (the group's new creates then parked behind it, and the
-- leader's release could publish it before its edge was released), or let
-- it take its group's room and park the batch's next tasks of the group.
--
-- ingest_enqueue_rewindow, a third step after the create, brings the SQL
-- create to the Go store's outcome. For each group with a task this call
-- created that now waits for an edge and one it created parked (the body
-- holds the group's advisory lock until the transaction ends): the
-- waiting tasks it parked are unparked, each with its outbox row held back
-- as a waiting task's is (due at 9999-12-31, task.HeldUntil); then the
-- group's room is counted again, as the body counts it (none while the
-- group has parked tasks of earlier creates: they go first; else its
-- window times its weight, less its tasks in the stream or running:
-- ingest_group_admitted, which leaves waiting tasks out), and that many of
-- the call's parked tasks are unparked, in the call's order, each with an
-- outbox row due now. A call none of whose tasks has both a group_key and
-- an edge to wait for (depends_on, sequence_key) costs a look at its JSON;
-- one with such a task, a read of its tasks by their ids.
--
-- ingest_group_window(kind, group) is a group's window in SQL (the kind's
-- group_window, or task.DefaultGroupWindow, 100, times the group's
-- weight): task/group.go's windowSQL; migrations 00031 and 00032 write the
-- same expression into their bodies.
-- +goose StatementBegin
CREATE FUNCTION ingest_group_window(k text, g text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT nullif(w.group_window, 0) FROM ingest_kind w WHERE w.kind = k), 100)::bigint
         * coalesce((SELECT (w.group_weights ->> g)::int FROM ingest_kind w WHERE w.kind = k), 1)
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION ingest_group_window(text, text) IS
    'the window of group g of kind k: how many of its tasks may be in the stream or running at once (task/group.go windowSQL)';

-- +goose StatementBegin
CREATE FUNCTION ingest_enqueue_rewindow(ids uuid[], tasks jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    held_until constant timestamptz := '9999-12-31 00:00:00+00';
    m_ids uuid[];
    m_kinds text[];
    m_groups text[];
    m_waits boolean[];
    m_parked boolean[];
    grp record;
    room bigint;
BEGIN
    -- Only a task with a group and an edge to wait for can need it.
    IF jsonb_typeof(tasks) <> 'array' OR NOT EXISTS (
        SELECT 1 FROM jsonb_array_elements(tasks) AS e
        WHERE jsonb_typeof(e) = 'object' AND coalesce(e->>'group_key', '') <> ''
          AND (jsonb_typeof(e->'depends_on') = 'array' OR coalesce(jsonb_typeof(e->'sequence_key'), 'null') <> 'null')) THEN
        RETURN;
    END IF;
    -- The tasks this call created with a group, once each, in the call's
    -- order: whether each waits for an edge, whether it is parked.
    SELECT array_agg(t.id ORDER BY x.ord), array_agg(t.kind ORDER BY x.ord), array_agg(t.group_key ORDER BY x.ord),
           array_agg(coalesce(t.waiting_for, 0) > 0 ORDER BY x.ord), array_agg(t.parked_at IS NOT NULL ORDER BY x.ord)
    INTO m_ids, m_kinds, m_groups, m_waits, m_parked
    FROM (SELECT DISTINCT ON (u.id) u.id, u.ord FROM unnest(ids) WITH ORDINALITY AS u(id, ord) ORDER BY u.id, u.ord) x
    JOIN ingest_task t ON t.id = x.id
    WHERE t.group_key IS NOT NULL AND t.created_at = now() AND t.status = 'QUEUED';
    IF m_ids IS NULL OR NOT (true = ANY(m_waits)) OR NOT (true = ANY(m_parked)) THEN
        RETURN;
    END IF;

    -- The groups with both.
    FOR grp IN
        SELECT m.kind, m.g FROM unnest(m_kinds, m_groups, m_waits, m_parked) AS m(kind, g, waits, parked)
        GROUP BY m.kind, m.g HAVING bool_or(m.waits) AND bool_or(m.parked)
        ORDER BY m.kind, m.g
    LOOP
        WITH w AS (
            UPDATE ingest_task t SET parked_at = NULL, updated_at = now()
            FROM unnest(m_ids, m_kinds, m_groups, m_waits, m_parked) AS m(id, kind, g, waits, parked)
            WHERE m.kind = grp.kind AND m.g = grp.g AND m.waits AND m.parked AND t.id = m.id
              AND t.parked_at IS NOT NULL AND t.waiting_for > 0 AND t.status = 'QUEUED'
            RETURNING t.id
        )
        INSERT INTO outbox_event (task_id, stream, next_retry_at)
        SELECT w.id, ingest_task_default_stream(), held_until FROM w ORDER BY w.id;

        SELECT CASE WHEN EXISTS (SELECT 1 FROM ingest_task p WHERE p.kind = grp.kind AND p.group_key = grp.g
                                 AND p.parked_at IS NOT NULL AND p.id <> ALL(ids)) THEN 0
                    ELSE greatest(ingest_group_window(grp.kind, grp.g) - ingest_group_admitted(grp.kind, grp.g), 0) END
        INTO room;
        CONTINUE WHEN room = 0;
        WITH picked AS (
            SELECT m.id FROM unnest(m_ids, m_kinds, m_groups, m_waits, m_parked) WITH ORDINALITY AS m(id, kind, g, waits, parked, ord)
            WHERE m.kind = grp.kind AND m.g = grp.g AND m.parked AND NOT m.waits
            ORDER BY m.ord LIMIT room
        ), u AS (
            UPDATE ingest_task t SET parked_at = NULL, updated_at = now()
            FROM picked p
            WHERE t.id = p.id AND t.parked_at IS NOT NULL AND coalesce(t.waiting_for, 0) = 0 AND t.status = 'QUEUED'
            RETURNING t.id
        )
        INSERT INTO outbox_event (task_id, stream, next_retry_at)
        SELECT u.id, ingest_task_default_stream(), now() FROM u ORDER BY u.id;
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- The entry points' step after the create (migration 00020) gains the
-- window's.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_enqueue_after(ids uuid[], tasks jsonb, numbered boolean) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM ingest_enqueue_link(ids, tasks, numbered);
    PERFORM ingest_enqueue_sequence(ids, tasks, numbered);
    PERFORM ingest_enqueue_rewindow(ids, tasks);
END;
$$;
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION ingest_group_window(text, text), ingest_enqueue_rewindow(uuid[], jsonb) FROM PUBLIC;

-- +goose Down
-- The step after the create of migration 00020 again.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_enqueue_after(ids uuid[], tasks jsonb, numbered boolean) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM ingest_enqueue_link(ids, tasks, numbered);
    PERFORM ingest_enqueue_sequence(ids, tasks, numbered);
END;
$$;
-- +goose StatementEnd
DROP FUNCTION ingest_enqueue_rewindow(uuid[], jsonb);
DROP FUNCTION ingest_group_window(text, text);
