-- +goose Up
-- The SQL create brought to the Go store's outcome where the two differed
-- (docs/FAIRNESS.md; task/group.go holdBack; a randomized comparison of the
-- two paths found the cases: sqlenqueue's TestSQLCreateMatchesGo).
--
-- 1. An item that an idempotency key or the payload dedup resolved to the
--    task of an earlier item of the call got that task's edges and place
--    in a sequence from its own depends_on and sequence_key: a task could
--    end up waiting for dependencies, or in a sequence, that the item that
--    created it never asked for. The Go store gives such an item nothing.
--    ingest_enqueue_after now hands ingest_enqueue_link and
--    ingest_enqueue_sequence each item's task only when the item created
--    it (the first item with that task); the fields of the others are
--    checked all the same.
--
-- 2. A group's window. The Go store leaves out of it a task that has
--    dependencies or follows an earlier task of its sequence in the batch
--    (it takes no room and is never created parked; the relay holds it to
--    the window once its edges are released, migration 00032), and an item
--    that repeats the idempotency key of an earlier item of the batch
--    (it creates nothing). The SQL entry points link the edges after
--    their body (ingest_enqueue_tasks) has decided the windows, and the
--    body finds repeated keys only at its insert, so it counted all of
--    them: it could create a task that waits for an edge parked (the
--    group's new creates then parked behind it, and the leader's release
--    could publish it before its edge was released), or let such tasks
--    take their group's room and park the call's next tasks of the group.
--    ingest_enqueue_rewindow(ids, tasks), a third step after the create,
--    settles each group in which the call created a parked task (the body
--    holds the group's advisory lock until the transaction ends): the
--    group's room before the call is counted again (none while it has
--    parked tasks of earlier creates: they go first; else its window
--    times its weight, less its tasks in the stream or running other than
--    the call's: ingest_group_admitted) and given, in order, to the call's
--    tasks due now that the window counts, unparking those of them the
--    body parked, each with an outbox row due now; a parked task the
--    window leaves out is unparked, with its outbox row held back
--    (task.HeldUntil) while it waits for an edge, or, free already, with
--    a row due now and next_retry_at set so that the relay holds it to the
--    window, as ingest_task_end_edges leaves a task it frees. The body
--    parks a superset of what this settles on, so this step only unparks.
--    A call none of whose items has a group_key with depends_on or
--    sequence_key, and whose items with a group_key repeat no
--    idempotency key, costs a look at its JSON; another, a read of its
--    tasks by their ids.
--    An item that repeats the idempotency key of a task created before the
--    call takes room in both paths (neither knows before its insert).
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
    m_exempt boolean[];
    m_counted boolean[];
    m_parked boolean[];
    m_due boolean[];
    grp record;
    room bigint;
BEGIN
    -- Only a call with an item with a group and an edge, or with a
    -- group and an idempotency key on more than one item, can have been
    -- counted wrong.
    IF jsonb_typeof(tasks) <> 'array' OR (NOT EXISTS (
        SELECT 1 FROM jsonb_array_elements(tasks) AS e
        WHERE jsonb_typeof(e) = 'object' AND coalesce(e->>'group_key', '') <> ''
          AND (jsonb_typeof(e->'depends_on') = 'array' OR coalesce(jsonb_typeof(e->'sequence_key'), 'null') <> 'null'))
      AND NOT EXISTS (
        SELECT 1 FROM jsonb_array_elements(tasks) AS e
        WHERE jsonb_typeof(e) = 'object' AND coalesce(e->>'idempotency_key', '') <> ''
        GROUP BY e->>'idempotency_key'
        HAVING count(*) > 1 AND bool_or(coalesce(e->>'group_key', '') <> ''))) THEN
        RETURN;
    END IF;
    -- The tasks this call created with a group, once each, in the order
    -- of the items that created them: whether the window leaves it out
    -- (exempt: as the Go store's holdBack leaves out every task with
    -- dependencies or behind an earlier task of its sequence in the
    -- batch, whose edges the relay holds it for once they are released;
    -- here, one that waits for an edge, has dependencies, or follows a
    -- task of this call in its sequence), whether ingest_group_admitted
    -- counts it, whether it is parked, whether it is due now (QUEUED, not
    -- delayed).
    SELECT array_agg(t.id ORDER BY x.ord), array_agg(t.kind ORDER BY x.ord), array_agg(t.group_key ORDER BY x.ord),
           array_agg(coalesce(t.waiting_for, 0) > 0 OR coalesce(t.dependency_depth, 0) > 0
                     OR (t.sequence_key IS NOT NULL AND EXISTS (
                         SELECT 1 FROM ingest_task s WHERE s.kind = t.kind AND s.sequence_key = t.sequence_key
                           AND s.sequence_no < t.sequence_no AND s.id = ANY(ids))) ORDER BY x.ord),
           array_agg(t.status = 'QUEUED' AND t.parked_at IS NULL AND coalesce(t.waiting_for, 0) = 0
                     AND (t.next_retry_at IS NULL OR t.next_retry_at <= now()) ORDER BY x.ord),
           array_agg(t.parked_at IS NOT NULL ORDER BY x.ord),
           array_agg(t.status = 'QUEUED' AND t.next_retry_at IS NULL ORDER BY x.ord)
    INTO m_ids, m_kinds, m_groups, m_exempt, m_counted, m_parked, m_due
    FROM (SELECT DISTINCT ON (u.id) u.id, u.ord FROM unnest(ids) WITH ORDINALITY AS u(id, ord) ORDER BY u.id, u.ord) x
    JOIN ingest_task t ON t.id = x.id
    WHERE t.group_key IS NOT NULL AND t.created_at = now();
    IF m_ids IS NULL OR NOT (true = ANY(m_parked)) THEN
        RETURN;
    END IF;

    FOR grp IN
        SELECT m.kind, m.g, count(*) FILTER (WHERE m.counted) AS counted
        FROM unnest(m_kinds, m_groups, m_counted, m_parked) AS m(kind, g, counted, parked)
        GROUP BY m.kind, m.g HAVING bool_or(m.parked)
        ORDER BY m.kind, m.g
    LOOP
        -- The room the group had before this call, given again to its
        -- tasks due now that the window counts, in order.
        SELECT CASE WHEN EXISTS (SELECT 1 FROM ingest_task p WHERE p.kind = grp.kind AND p.group_key = grp.g
                                 AND p.parked_at IS NOT NULL AND p.id <> ALL(ids)) THEN 0
                    ELSE greatest(ingest_group_window(grp.kind, grp.g)
                                  - (ingest_group_admitted(grp.kind, grp.g) - grp.counted), 0) END
        INTO room;

        -- A parked exempt task is unparked: one that waits for an edge
        -- with its outbox row held back; one free already (its edges were
        -- released at once, or never made: its predecessor was cancelled
        -- by this call) due now with a due time of its own, which the
        -- relay holds to the window (migration 00032), as
        -- ingest_task_end_edges leaves a task it frees.
        WITH w AS (
            UPDATE ingest_task t SET parked_at = NULL, updated_at = now(),
                next_retry_at = CASE WHEN coalesce(t.waiting_for, 0) = 0 THEN coalesce(t.next_retry_at, now()) ELSE t.next_retry_at END
            FROM unnest(m_ids, m_kinds, m_groups, m_exempt, m_parked) AS m(id, kind, g, exempt, parked)
            WHERE m.kind = grp.kind AND m.g = grp.g AND m.exempt AND m.parked AND t.id = m.id
              AND t.parked_at IS NOT NULL AND t.status = 'QUEUED'
            RETURNING t.id, coalesce(t.waiting_for, 0) > 0 AS waits
        )
        INSERT INTO outbox_event (task_id, stream, next_retry_at)
        SELECT w.id, ingest_task_default_stream(), CASE WHEN w.waits THEN held_until ELSE now() END FROM w ORDER BY w.id;

        CONTINUE WHEN room = 0;
        WITH picked AS (
            SELECT m.id, m.parked FROM unnest(m_ids, m_kinds, m_groups, m_exempt, m_parked, m_due)
                WITH ORDINALITY AS m(id, kind, g, exempt, parked, due, ord)
            WHERE m.kind = grp.kind AND m.g = grp.g AND m.due AND NOT m.exempt
            ORDER BY m.ord LIMIT room
        ), u AS (
            UPDATE ingest_task t SET parked_at = NULL, updated_at = now()
            FROM picked p
            WHERE p.parked AND t.id = p.id AND t.parked_at IS NOT NULL AND coalesce(t.waiting_for, 0) = 0 AND t.status = 'QUEUED'
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
DECLARE
    own uuid[] := ids;
BEGIN
    -- Each item's task when the item created it, else NULL: an item that
    -- an idempotency key or the payload dedup resolved to an earlier
    -- item's task gets neither edges nor a place in a sequence from its
    -- own fields (they are checked all the same), as in the Go store.
    IF jsonb_typeof(tasks) = 'array' AND EXISTS (
        SELECT 1 FROM jsonb_array_elements(tasks) AS e
        WHERE jsonb_typeof(e) = 'object' AND (e ? 'depends_on' OR e ? 'sequence_key')) THEN
        own := ARRAY(SELECT CASE WHEN row_number() OVER (PARTITION BY u.id ORDER BY u.ord) = 1 THEN u.id END
                     FROM unnest(ids) WITH ORDINALITY AS u(id, ord) ORDER BY u.ord);
    END IF;
    PERFORM ingest_enqueue_link(own, tasks, numbered);
    PERFORM ingest_enqueue_sequence(own, tasks, numbered);
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
