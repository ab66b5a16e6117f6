-- +goose Up
-- A group's window is at most its kind's concurrency_per_group
-- (docs/ARCHITECTURE.md §3.1, per-group limits and fair scheduling).
--
-- The window bounds a group's tasks in the stream or running; the
-- per-group concurrency limit bounds those running. With a window above
-- the limit, the tasks between the two reached workers only to be parked
-- at the limit (ParkedAtLimit) and released again, each turn taking the
-- group's start lock and the kind's release lock, ahead of the other
-- groups' tasks in the stream: under a burst of one group held to 12 of
-- 24 handler slots, the quiet groups' starts waited 80-160 ms at p95
-- instead of about 30 with a window of 12.
--
-- 1. ingest_group_window(kind, group): the kind's group_window (or 100)
--    times the group's weight, and at most the kind's
--    concurrency_per_group when it has one (task/group.go windowSQL).
-- 2. ingest_task_hold_due, the relay's hold of a delayed task fallen due,
--    and ingest_enqueue_tasks, the SQL create, read the window through
--    ingest_group_window instead of an expression of their own.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_group_window(k text, g text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT least(coalesce((SELECT nullif(w.group_window, 0) FROM ingest_kind w WHERE w.kind = k), 100)::bigint
                 * coalesce((SELECT (w.group_weights ->> g)::int FROM ingest_kind w WHERE w.kind = k), 1),
                 coalesce((SELECT nullif(w.concurrency_per_group, 0) FROM ingest_kind w WHERE w.kind = k), 2147483647))
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION ingest_group_window(text, text) IS
    'the window of group g of kind k: how many of its tasks may be in the stream or running at once, at most its kind''s concurrency_per_group (task/group.go windowSQL)';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_task_hold_due(ids uuid[]) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off SET lock_timeout = '50ms' AS $$
DECLARE
    cids uuid[];
    ck text[];
    cg text[];
    cdue timestamptz[];
    gk text[] := '{}';
    gg text[] := '{}';
    groom bigint[] := '{}';
    binds boolean := false;
    waited boolean := false;
    locked boolean;
    grp record;
    win bigint;
    room bigint;
    held uuid[];
BEGIN
    -- The candidates: QUEUED, with a group, not parked, not held, due.
    SELECT array_agg(t.id), array_agg(t.kind), array_agg(t.group_key), array_agg(t.next_retry_at)
    INTO cids, ck, cg, cdue
    FROM unnest(ids) AS i(id) JOIN ingest_task t ON t.id = i.id
    WHERE CASE WHEN t.group_key IS NOT NULL AND t.status = 'QUEUED' AND t.parked_at IS NULL
                AND coalesce(t.waiting_for, 0) = 0 AND t.next_retry_at <= now() THEN true ELSE false END;
    IF cids IS NULL THEN
        RETURN '{}';
    END IF;
    -- Each group's room, under its lock, the groups in the create's
    -- order: none while it has parked tasks (they go first), else its
    -- window less its tasks in the stream or running, the candidates
    -- (due and not parked: counted there) aside.
    FOR grp IN SELECT u.k, u.g, count(*) AS n FROM unnest(ck, cg) AS u(k, g) GROUP BY u.k, u.g ORDER BY u.k, u.g LOOP
        -- A create holds its groups' locks until its transaction ends, and
        -- a caller's own transaction (CreateTx) may last: the pass waits
        -- up to lock_timeout for the first busy group, and not at all for
        -- the next ones once one has made it wait in vain. A group whose
        -- lock it did not get is not held this time: its tasks are
        -- published.
        IF waited THEN
            locked := pg_try_advisory_xact_lock(hashtextextended('ingest-group/' || grp.k || '/' || grp.g, 0));
        ELSE
            BEGIN
                PERFORM pg_advisory_xact_lock(hashtextextended('ingest-group/' || grp.k || '/' || grp.g, 0));
                locked := true;
            EXCEPTION WHEN lock_not_available THEN
                locked := false;
                waited := true;
            END;
        END IF;
        IF NOT locked THEN
            room := grp.n;
        ELSIF EXISTS (SELECT 1 FROM ingest_task p WHERE p.kind = grp.k AND p.group_key = grp.g AND p.parked_at IS NOT NULL) THEN
            room := 0;
        ELSE
            win := ingest_group_window(grp.k, grp.g);
            room := greatest(win - (ingest_group_admitted(grp.k, grp.g) - grp.n), 0);
        END IF;
        IF room < grp.n THEN
            binds := true;
        END IF;
        gk := gk || grp.k;
        gg := gg || grp.g;
        groom := groom || room;
    END LOOP;
    IF NOT binds THEN
        RETURN '{}';
    END IF;
    -- The candidates beyond their group's room, in the order they fell
    -- due, are parked. Only they are locked, re-checked on their latest
    -- version; one another transaction holds is left to be published.
    WITH ranked AS (
        SELECT c.id, c.k, c.g, row_number() OVER (PARTITION BY c.k, c.g ORDER BY c.due, c.id) AS rn
        FROM unnest(cids, ck, cg, cdue) AS c(id, k, g, due)
    ), beyond AS (
        SELECT t.id FROM ranked r JOIN unnest(gk, gg, groom) AS m(k, g, room) ON m.k = r.k AND m.g = r.g
            JOIN ingest_task t ON t.id = r.id
        WHERE r.rn > m.room
          AND CASE WHEN t.status = 'QUEUED' AND t.parked_at IS NULL AND coalesce(t.waiting_for, 0) = 0 THEN true ELSE false END
        ORDER BY t.id
        FOR NO KEY UPDATE OF t SKIP LOCKED
    ), parked AS (
        UPDATE ingest_task t SET parked_at = now(), next_retry_at = NULL, updated_at = now()
        FROM beyond b WHERE t.id = b.id
        RETURNING t.id
    )
    SELECT coalesce(array_agg(id), '{}') INTO held FROM parked;
    RETURN held;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_enqueue_tasks(tasks jsonb, numbered boolean) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    lim constant jsonb := ingest_enqueue_limits();
    max_kind constant int := (lim->>'max_kind_bytes')::int;
    max_key constant int := (lim->>'max_idempotency_key_bytes')::int;
    att_min constant bigint := (lim->>'max_attempts_min')::bigint;
    att_max constant bigint := (lim->>'max_attempts_max')::bigint;
    delay_max constant bigint := (lim->>'max_delay_ms')::bigint;
    timeout_max constant bigint := (lim->>'max_timeout_ms')::bigint;
    horizon_days constant int := (lim->>'schedule_horizon_days')::int;
    horizon constant timestamptz := now() + make_interval(hours => horizon_days * 24);
    fields constant text[] := ARRAY['kind', 'payload', 'idempotency_key', 'max_attempts', 'run_at', 'delay_ms',
        'timeout_ms', 'traceparent', 'dedup_by_payload', 'priority', 'group_key'];
    -- The options the entry points ingest_enqueue and ingest_enqueue_batch
    -- take themselves and strip before this body (migrations 00018, 00020):
    -- named in the hint of an unknown field, with the fields above.
    entry_fields constant text[] := ARRAY['depends_on', 'on_dependency_failure', 'sequence_key'];
    -- Go's unicode.IsSpace, which strings.TrimSpace trims from a kind.
    space constant text := E' \t\n\u000b\f\r' || U&'\0085\00A0\1680\2000\2001\2002\2003\2004\2005\2006\2007\2008\2009\200A\2028\2029\202F\205F\3000';
    -- termsafe.Unsafe: C0, DEL, C1, bidirectional controls, U+2028/9.
    unsafe_re constant text := '[\x01-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]';
    rfc3339 constant text := '^(\d{4})-\d{2}-\d{2}T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$';
    -- The settings of ingest_enqueue_batch (the one place an operator sets
    -- them, for both functions).
    stream text;
    max_payload int;

    n int;
    us bigint;
    el jsonb;
    pre text;
    f text;
    m text;
    code text;
    v jsonb;
    t text;
    c text;

    k text;
    canon text;
    key text;
    att int;
    run_at timestamptz;
    delay bigint;
    timeout bigint;
    tp text;
    dd boolean;
    prio smallint;
    grp text;

    ids uuid[] := '{}';
    kinds text[] := '{}';
    payloads text[] := '{}';
    shas text[] := '{}';
    keys text[] := '{}';
    atts int[] := '{}';
    dues timestamptz[] := '{}';
    timeouts bigint[] := '{}';
    tps text[] := '{}';
    dedups boolean[] := '{}';
    prios smallint[] := '{}';
    groups text[] := '{}';
    timed boolean[] := '{}';
    held boolean[];
    keyed boolean := false;
    any_dedup boolean := false;
    resolved uuid[];
    same int[];
    hit uuid;
    ins uuid[];
    res uuid[];
BEGIN
    SELECT (SELECT substr(x, 15) FROM unnest(proconfig) AS x WHERE x LIKE 'ingest.stream=%'),
           (SELECT substr(x, 26) FROM unnest(proconfig) AS x WHERE x LIKE 'ingest.max\_payload\_bytes=%')::int
    INTO stream, max_payload
    FROM pg_proc WHERE oid = 'ingest_enqueue_batch(jsonb)'::regprocedure;
    IF tasks IS NULL OR jsonb_typeof(tasks) <> 'array' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'tasks',
            MESSAGE = format('tasks must be a JSON array, got %s', coalesce(jsonb_typeof(tasks), 'NULL'));
    END IF;
    IF stream IS NULL OR stream = '' OR max_payload IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'ingest_enqueue_batch(jsonb) lacks its settings ingest.stream and ingest.max_payload_bytes',
            HINT = 'ALTER FUNCTION ingest_enqueue_batch(jsonb) SET ingest.stream = ''ingest:tasks'' (and SET ingest.max_payload_bytes = ''1048576'')';
    END IF;
    n := jsonb_array_length(tasks);

    FOR pos IN 0 .. n - 1 LOOP
        el := tasks->pos;
        f := NULL; m := NULL; code := '22023';

        IF jsonb_typeof(el) <> 'object' THEN
            f := ''; m := format('the task must be a JSON object, got %s', jsonb_typeof(el));
        ELSIF (el - fields) <> '{}'::jsonb THEN
            SELECT x INTO f FROM jsonb_object_keys(el - fields) AS x ORDER BY x COLLATE "C" LIMIT 1;
            m := format('unknown field "%s"', f);
        END IF;

        -- The types of the fields, as the API's JSON decoding checks them
        -- (a JSON null is an absent field): at once when they are right,
        -- field by field to name the wrong one.
        IF m IS NULL AND NOT (
            coalesce(jsonb_typeof(el->'kind'), 'null') IN ('string', 'null')
            AND coalesce(jsonb_typeof(el->'idempotency_key'), 'null') IN ('string', 'null')
            AND coalesce(jsonb_typeof(el->'run_at'), 'null') IN ('string', 'null')
            AND coalesce(jsonb_typeof(el->'traceparent'), 'null') IN ('string', 'null')
            AND coalesce(jsonb_typeof(el->'group_key'), 'null') IN ('string', 'null')
            AND coalesce(jsonb_typeof(el->'dedup_by_payload'), 'null') IN ('boolean', 'null')
            AND (el->'max_attempts' IS NULL OR (el->>'max_attempts') IS NULL OR (el->>'max_attempts') ~ '^-?\d{1,18}$')
            AND (el->'delay_ms' IS NULL OR (el->>'delay_ms') IS NULL OR (el->>'delay_ms') ~ '^-?\d{1,18}$')
            AND (el->'timeout_ms' IS NULL OR (el->>'timeout_ms') IS NULL OR (el->>'timeout_ms') ~ '^-?\d{1,18}$')
            AND (el->'priority' IS NULL OR (el->>'priority') IS NULL OR (el->>'priority') ~ '^-?\d{1,18}$')
            AND jsonb_typeof(el->'priority') IS DISTINCT FROM 'string'
            AND jsonb_typeof(el->'max_attempts') IS DISTINCT FROM 'string'
            AND jsonb_typeof(el->'delay_ms') IS DISTINCT FROM 'string'
            AND jsonb_typeof(el->'timeout_ms') IS DISTINCT FROM 'string') THEN
            FOREACH c IN ARRAY fields LOOP
                v := el->c;
                t := jsonb_typeof(v);
                CONTINUE WHEN t IS NULL OR t = 'null' OR c = 'payload';
                IF c IN ('max_attempts', 'delay_ms', 'timeout_ms', 'priority') THEN
                    -- Not a JSON number, a fraction, or beyond int64.
                    IF t <> 'number' OR v::text !~ '^-?\d{1,19}$'
                       OR v::text::numeric NOT BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
                        m := format('%s must be a whole number from %s to %s, got %s', c,
                            CASE c WHEN 'max_attempts' THEN att_min WHEN 'priority' THEN 1 ELSE 0 END,
                            CASE c WHEN 'max_attempts' THEN att_max WHEN 'delay_ms' THEN delay_max WHEN 'priority' THEN 4 ELSE timeout_max END,
                            CASE t WHEN 'number' THEN 'number ' || v::text WHEN 'boolean' THEN 'bool' ELSE t END);
                    END IF;
                ELSIF c = 'dedup_by_payload' THEN
                    IF t <> 'boolean' THEN
                        m := format('%s must be a JSON boolean, got %s', c, t);
                    END IF;
                ELSIF t <> 'string' THEN
                    m := format('%s must be a JSON string, got %s', c, CASE t WHEN 'boolean' THEN 'bool' ELSE t END);
                END IF;
                IF m IS NOT NULL THEN
                    f := c;
                    EXIT;
                END IF;
            END LOOP;
        END IF;

        IF m IS NULL THEN
            v := el->'payload';
            IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
                f := 'payload'; m := 'payload is required (any JSON value but null)';
            ELSIF jsonb_typeof(el->'max_attempts') = 'number' AND (el->>'max_attempts')::bigint NOT BETWEEN att_min AND att_max THEN
                f := 'max_attempts';
                m := format('max_attempts must be a whole number from %s to %s, got %s', att_min, att_max, el->>'max_attempts');
            ELSIF jsonb_typeof(el->'run_at') = 'string' AND el->>'run_at' <> '' AND el->>'run_at' !~ rfc3339 THEN
                f := 'run_at';
                m := format('run_at "%s" is not an RFC 3339 time (e.g. 2026-01-02T15:04:05Z)', el->>'run_at');
            ELSIF jsonb_typeof(el->'delay_ms') = 'number' AND (el->>'delay_ms')::bigint NOT BETWEEN 0 AND delay_max THEN
                f := 'delay_ms';
                m := format('delay_ms must be a whole number from 0 to %s, got %s', delay_max, el->>'delay_ms');
            ELSIF jsonb_typeof(el->'timeout_ms') = 'number' AND (el->>'timeout_ms')::bigint NOT BETWEEN 0 AND timeout_max THEN
                f := 'timeout_ms';
                m := format('timeout_ms must be a whole number from 0 to %s, got %s', timeout_max, el->>'timeout_ms');
            ELSIF jsonb_typeof(el->'priority') = 'number' AND (el->>'priority')::bigint NOT BETWEEN 1 AND 4 THEN
                -- task.PriorityRange
                f := 'priority';
                m := format('priority must be a whole number from 1 to 4, got %s', el->>'priority');
            END IF;
        END IF;

        IF m IS NULL THEN
            k := btrim(coalesce(el->>'kind', ''), space);
            key := coalesce(el->>'idempotency_key', '');
            att := (el->>'max_attempts')::int;
            delay := coalesce((el->>'delay_ms')::bigint, 0);
            timeout := coalesce((el->>'timeout_ms')::bigint, 0);
            tp := coalesce(el->>'traceparent', '');
            dd := coalesce((el->>'dedup_by_payload')::boolean, false);
            grp := coalesce(el->>'group_key', '');
            -- The default, 2, is stored as NULL (migration 00019).
            prio := NULLIF((el->>'priority')::smallint, 2);
            t := coalesce(el->>'run_at', '');
            run_at := NULL;
            IF t <> '' AND substr(t, 1, 4) <> '0000' THEN
                -- A date that does not exist (February 30) is no time;
                -- checked here, not by a failing cast (no subtransaction).
                IF substr(t, 9, 2)::int BETWEEN 1 AND extract(day FROM
                    make_date(substr(t, 1, 4)::int, greatest(least(substr(t, 6, 2)::int, 12), 1), 1) + interval '1 month - 1 day')
                   AND substr(t, 6, 2)::int BETWEEN 1 AND 12 THEN
                    run_at := t::timestamptz;
                ELSE
                    f := 'run_at';
                    m := format('run_at "%s" is not an RFC 3339 time (e.g. 2026-01-02T15:04:05Z)', t);
                END IF;
            END IF;
        END IF;

        -- The checks of task.NewTask.Validate, in its order.
        IF m IS NULL THEN
            IF k = '' THEN
                f := 'kind'; m := 'kind is required';
            ELSIF octet_length(k) > max_kind THEN
                f := 'kind'; m := format('kind is longer than %s bytes', max_kind);
            ELSIF k ~ unsafe_re THEN
                f := 'kind'; c := substring(k FROM unsafe_re);
                m := format('kind must not hold control or bidirectional characters, got %s at byte %s',
                    ingest_enqueue_escape(c), octet_length(substring(k FROM '^[^' || substr(unsafe_re, 2) || '*')));
            ELSIF octet_length(key) > max_key THEN
                f := 'idempotency_key'; m := format('idempotency_key is longer than %s bytes', max_key);
            ELSIF key ~ unsafe_re THEN
                f := 'idempotency_key'; c := substring(key FROM unsafe_re);
                m := format('idempotency_key must not hold control or bidirectional characters, got %s at byte %s',
                    ingest_enqueue_escape(c), octet_length(substring(key FROM '^[^' || substr(unsafe_re, 2) || '*')));
            ELSIF octet_length(grp) > 200 THEN
                f := 'group_key'; m := 'group_key is longer than 200 bytes';
            ELSIF grp ~ unsafe_re THEN
                f := 'group_key'; c := substring(grp FROM unsafe_re);
                m := format('group_key must not hold control or bidirectional characters, got %s at byte %s',
                    ingest_enqueue_escape(c), octet_length(substring(grp FROM '^[^' || substr(unsafe_re, 2) || '*')));
            ELSIF grp LIKE ' %' OR grp LIKE '% ' THEN
                f := 'group_key'; m := 'group_key must not begin or end with a space';
            ELSIF tp <> '' AND NOT ingest_enqueue_valid_traceparent(tp) THEN
                f := 'traceparent';
                m := format('traceparent "%s" is not a valid W3C traceparent', ingest_enqueue_clip(tp, 64));
            ELSIF delay > 0 AND t <> '' THEN
                f := 'run_at'; m := 'run_at and delay_ms are exclusive: set at most one';
            ELSIF t <> '' AND substr(t, 1, 4) = '0000' THEN
                f := 'run_at';
                m := format('run_at %s is out of range (year 1 or later)', ingest_enqueue_rfc3339(t));
            ELSIF run_at > horizon THEN
                f := 'run_at';
                m := format('run_at %s is beyond the scheduling horizon: at most %s days (about %s years) from now',
                    ingest_enqueue_rfc3339(t), horizon_days, horizon_days / 365);
            ELSE
                canon := ingest_canonical_json(el->'payload');
                IF octet_length(canon) > max_payload THEN
                    f := 'payload'; code := '54000';
                    m := format('payload is %s bytes, the limit is %s', octet_length(canon), max_payload);
                END IF;
            END IF;
        END IF;

        IF m IS NOT NULL THEN
            pre := CASE WHEN numbered THEN format('task %s: ', pos) ELSE '' END;
        END IF;
        IF m LIKE 'unknown field%' THEN
            RAISE EXCEPTION USING ERRCODE = code, COLUMN = f, MESSAGE = pre || m,
                HINT = 'the fields are ' || array_to_string(fields || entry_fields, ', ');
        ELSIF m IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = code, COLUMN = f, MESSAGE = pre || m;
        END IF;

        -- A UUIDv7 (RFC 9562) as google/uuid's NewV7 makes them in Go: 48
        -- bits of Unix milliseconds, the version, 12 bits of sub-millisecond
        -- fraction (so ids follow their creation), then random bits with
        -- the variant.
        us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
        ids := ids || encode(overlay(uuid_send(gen_random_uuid()) PLACING
            int8send(((us / 1000) << 16) | 28672 | ((us % 1000) * 4096 / 1000)) FROM 1 FOR 8), 'hex')::uuid;
        kinds := kinds || k;
        payloads := payloads || canon;
        shas := shas || encode(sha256(convert_to(canon, 'UTF8')), 'hex');
        keys := keys || key;
        atts := atts || coalesce(att, 0);
        -- When a delayed task is due (its next_retry_at and due_at; NULL:
        -- due now), from the database's clock as in task/create.go.
        dues := dues || CASE WHEN run_at > now() THEN run_at
                             WHEN delay > 0 THEN now() + delay * interval '1 millisecond' END;
        timeouts := timeouts || timeout;
        tps := tps || tp;
        dedups := dedups || dd;
        groups := groups || grp;
        timed := timed || (run_at IS NOT NULL OR delay > 0);
        prios := prios || prio;
        keyed := keyed OR key <> '';
        any_dedup := any_dedup OR dd;
    END LOOP;
    IF n = 0 THEN
        RETURN '{}';
    END IF;

    -- resolved[i]: the existing task item i turned out to be (payload
    -- dedup); NULL: to insert. same[i]: the first item of the batch with
    -- item i's dedup key (i itself for the first).
    resolved := array_fill(NULL::uuid, ARRAY[n]);
    IF any_dedup THEN
        -- As the Go store: one advisory lock per (kind, payload_sha), taken
        -- in one order, then an existing non-DEAD dedup task, else the
        -- first item of the batch with the same key.
        PERFORM pg_advisory_xact_lock(hashtextextended(x, 0))
        FROM (SELECT DISTINCT kinds[i] || '/' || shas[i] AS x FROM generate_subscripts(ids, 1) AS i WHERE dedups[i]) d
        ORDER BY x COLLATE "C";
        same := ARRAY(SELECT CASE WHEN dedups[i] THEN min(i) OVER (PARTITION BY dedups[i], kinds[i], shas[i]) END
                      FROM generate_subscripts(ids, 1) AS i ORDER BY i);
        FOR i IN 1 .. n LOOP
            IF same[i] = i THEN
                SELECT id INTO hit FROM ingest_task
                WHERE ingest_task.kind = kinds[i] AND payload_sha = shas[i] AND dedup AND status <> 'DEAD'
                ORDER BY created_at LIMIT 1;
                resolved[i] := hit;
            ELSIF same[i] IS NOT NULL THEN
                resolved[i] := ids[i]; -- not inserted: the first one's task, below
            END IF;
        END LOOP;
    END IF;

    -- A task due now with a group, beyond the room its group's window
    -- leaves, is created parked, as task/create.go does (holdBack and
    -- createRoomSQL in task/group.go): the groups' advisory locks in the
    -- Go store's names and order, so that concurrent creators of a group
    -- count its window one after the other; then each group's room (none
    -- while it has parked tasks: they go first; else its window,
    -- ingest_group_window, less its tasks in the stream or running:
    -- ingest_group_admitted), given to the
    -- batch's tasks in order.
    held := array_fill(false, ARRAY[n]);
    IF EXISTS (SELECT 1 FROM generate_subscripts(ids, 1) AS i WHERE groups[i] <> '' AND NOT timed[i] AND resolved[i] IS NULL) THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('ingest-group/' || x.k || '/' || x.g, 0))
        FROM (SELECT DISTINCT kinds[i] AS k, groups[i] AS g FROM generate_subscripts(ids, 1) AS i
              WHERE groups[i] <> '' AND NOT timed[i] AND resolved[i] IS NULL) x
        ORDER BY x.k, x.g;
        WITH items AS (
            SELECT i, kinds[i] AS k, groups[i] AS g, (groups[i] <> '' AND NOT timed[i] AND resolved[i] IS NULL) AS holdable
            FROM generate_subscripts(ids, 1) AS i
        ), ranked AS (
            SELECT items.*, row_number() OVER (PARTITION BY k, g, holdable ORDER BY i) AS rn FROM items
        ), room AS (
            SELECT x.k, x.g,
                CASE WHEN EXISTS (SELECT 1 FROM ingest_task p WHERE p.kind = x.k AND p.group_key = x.g AND p.parked_at IS NOT NULL) THEN 0
                     ELSE greatest(
                        ingest_group_window(x.k, x.g) - ingest_group_admitted(x.k, x.g), 0) END AS room
            FROM (SELECT DISTINCT k, g FROM items WHERE holdable) x
        )
        SELECT array_agg(coalesce(r.holdable AND r.rn > room.room, false) ORDER BY r.i) INTO held
        FROM ranked r LEFT JOIN room ON room.k = r.k AND room.g = r.g;
    END IF;

    -- The insert of task/create.go (insertTasksSQL), its audit rows and
    -- outbox rows, in one statement. A task whose id is below the pending
    -- low-water cutoff is created lingering (migration 00025); a task held
    -- back by its group's window is created parked, without an outbox row
    -- (the release that unparks it writes one).
    WITH inserted AS (
        INSERT INTO ingest_task AS it (id, kind, payload, payload_sha, idempotency_key, max_attempts, next_retry_at, due_at, timeout_ms, traceparent, dedup, priority, group_key,
            parked_at, lingering)
        SELECT id, kind, payload::jsonb, sha, NULLIF(key, ''), NULLIF(max_attempts, 0), due, due,
            NULLIF(timeout_ms, 0), NULLIF(traceparent, ''), dedup, priority, NULLIF(grp, ''),
            CASE WHEN hold THEN now() END,
            CASE WHEN id < (SELECT ingest_task_pending_cutoff()) THEN true END
        FROM unnest(ids, kinds, payloads, shas, keys, atts, dues, timeouts, tps, dedups, prios, resolved, groups, held)
                WITH ORDINALITY AS s(id, kind, payload, sha, key, max_attempts, due, timeout_ms, traceparent, dedup, priority, done, grp, hold, ord)
        WHERE done IS NULL
        ORDER BY ord
        ON CONFLICT (kind, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING it.id, it.next_retry_at, it.parked_at
    ), audit AS (
        INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, message)
        SELECT id, NULL, 'QUEUED', 0, 'created' FROM inserted ORDER BY id
    ), outbox AS (
        INSERT INTO outbox_event (task_id, stream, next_retry_at)
        SELECT id, stream, coalesce(next_retry_at, now()) FROM inserted WHERE parked_at IS NULL ORDER BY id
    )
    SELECT array_agg(id) INTO ins FROM inserted;

    -- Each item's task: its own when inserted, else the existing one (the
    -- payload dedup's, or the holder of its idempotency key: a task that
    -- existed, or an earlier item of this batch).
    IF coalesce(array_length(ins, 1), 0) = n THEN
        RETURN ids; -- all new
    END IF;
    res := ARRAY(
        SELECT CASE WHEN s.id IN (SELECT unnest(ins)) THEN s.id
                    ELSE coalesce(s.done, (SELECT tt.id FROM ingest_task tt WHERE tt.kind = s.kind AND tt.idempotency_key = s.key)) END
        FROM unnest(ids, kinds, keys, resolved) WITH ORDINALITY AS s(id, kind, key, done, ord)
        ORDER BY s.ord);
    IF any_dedup THEN
        FOR i IN 1 .. n LOOP
            IF same[i] < i THEN
                res[i] := res[same[i]];
            END IF;
        END LOOP;
    END IF;
    RETURN res;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- The window without the per-group concurrency, and the bodies of
-- migrations 00032 and 00033.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_group_window(k text, g text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT nullif(w.group_window, 0) FROM ingest_kind w WHERE w.kind = k), 100)::bigint
         * coalesce((SELECT (w.group_weights ->> g)::int FROM ingest_kind w WHERE w.kind = k), 1)
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION ingest_group_window(text, text) IS
    'the window of group g of kind k: how many of its tasks may be in the stream or running at once (task/group.go windowSQL)';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_task_hold_due(ids uuid[]) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off SET lock_timeout = '50ms' AS $$
DECLARE
    cids uuid[];
    ck text[];
    cg text[];
    cdue timestamptz[];
    gk text[] := '{}';
    gg text[] := '{}';
    groom bigint[] := '{}';
    binds boolean := false;
    waited boolean := false;
    locked boolean;
    grp record;
    win bigint;
    room bigint;
    held uuid[];
BEGIN
    -- The candidates: QUEUED, with a group, not parked, not held, due.
    SELECT array_agg(t.id), array_agg(t.kind), array_agg(t.group_key), array_agg(t.next_retry_at)
    INTO cids, ck, cg, cdue
    FROM unnest(ids) AS i(id) JOIN ingest_task t ON t.id = i.id
    WHERE CASE WHEN t.group_key IS NOT NULL AND t.status = 'QUEUED' AND t.parked_at IS NULL
                AND coalesce(t.waiting_for, 0) = 0 AND t.next_retry_at <= now() THEN true ELSE false END;
    IF cids IS NULL THEN
        RETURN '{}';
    END IF;
    -- Each group's room, under its lock, the groups in the create's
    -- order: none while it has parked tasks (they go first), else its
    -- window less its tasks in the stream or running, the candidates
    -- (due and not parked: counted there) aside.
    FOR grp IN SELECT u.k, u.g, count(*) AS n FROM unnest(ck, cg) AS u(k, g) GROUP BY u.k, u.g ORDER BY u.k, u.g LOOP
        -- A create holds its groups' locks until its transaction ends, and
        -- a caller's own transaction (CreateTx) may last: the pass waits
        -- up to lock_timeout for the first busy group, and not at all for
        -- the next ones once one has made it wait in vain. A group whose
        -- lock it did not get is not held this time: its tasks are
        -- published.
        IF waited THEN
            locked := pg_try_advisory_xact_lock(hashtextextended('ingest-group/' || grp.k || '/' || grp.g, 0));
        ELSE
            BEGIN
                PERFORM pg_advisory_xact_lock(hashtextextended('ingest-group/' || grp.k || '/' || grp.g, 0));
                locked := true;
            EXCEPTION WHEN lock_not_available THEN
                locked := false;
                waited := true;
            END;
        END IF;
        IF NOT locked THEN
            room := grp.n;
        ELSIF EXISTS (SELECT 1 FROM ingest_task p WHERE p.kind = grp.k AND p.group_key = grp.g AND p.parked_at IS NOT NULL) THEN
            room := 0;
        ELSE
            SELECT coalesce(nullif(w.group_window, 0), 100) * coalesce((w.group_weights ->> grp.g)::int, 1) INTO win
            FROM ingest_kind w WHERE w.kind = grp.k;
            room := greatest(coalesce(win, 100) - (ingest_group_admitted(grp.k, grp.g) - grp.n), 0);
        END IF;
        IF room < grp.n THEN
            binds := true;
        END IF;
        gk := gk || grp.k;
        gg := gg || grp.g;
        groom := groom || room;
    END LOOP;
    IF NOT binds THEN
        RETURN '{}';
    END IF;
    -- The candidates beyond their group's room, in the order they fell
    -- due, are parked. Only they are locked, re-checked on their latest
    -- version; one another transaction holds is left to be published.
    WITH ranked AS (
        SELECT c.id, c.k, c.g, row_number() OVER (PARTITION BY c.k, c.g ORDER BY c.due, c.id) AS rn
        FROM unnest(cids, ck, cg, cdue) AS c(id, k, g, due)
    ), beyond AS (
        SELECT t.id FROM ranked r JOIN unnest(gk, gg, groom) AS m(k, g, room) ON m.k = r.k AND m.g = r.g
            JOIN ingest_task t ON t.id = r.id
        WHERE r.rn > m.room
          AND CASE WHEN t.status = 'QUEUED' AND t.parked_at IS NULL AND coalesce(t.waiting_for, 0) = 0 THEN true ELSE false END
        ORDER BY t.id
        FOR NO KEY UPDATE OF t SKIP LOCKED
    ), parked AS (
        UPDATE ingest_task t SET parked_at = now(), next_retry_at = NULL, updated_at = now()
        FROM beyond b WHERE t.id = b.id
        RETURNING t.id
    )
    SELECT coalesce(array_agg(id), '{}') INTO held FROM parked;
    RETURN held;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_enqueue_tasks(tasks jsonb, numbered boolean) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    lim constant jsonb := ingest_enqueue_limits();
    max_kind constant int := (lim->>'max_kind_bytes')::int;
    max_key constant int := (lim->>'max_idempotency_key_bytes')::int;
    att_min constant bigint := (lim->>'max_attempts_min')::bigint;
    att_max constant bigint := (lim->>'max_attempts_max')::bigint;
    delay_max constant bigint := (lim->>'max_delay_ms')::bigint;
    timeout_max constant bigint := (lim->>'max_timeout_ms')::bigint;
    horizon_days constant int := (lim->>'schedule_horizon_days')::int;
    horizon constant timestamptz := now() + make_interval(hours => horizon_days * 24);
    fields constant text[] := ARRAY['kind', 'payload', 'idempotency_key', 'max_attempts', 'run_at', 'delay_ms',
        'timeout_ms', 'traceparent', 'dedup_by_payload', 'priority', 'group_key'];
    -- The options the entry points ingest_enqueue and ingest_enqueue_batch
    -- take themselves and strip before this body (migrations 00018, 00020):
    -- named in the hint of an unknown field, with the fields above.
    entry_fields constant text[] := ARRAY['depends_on', 'on_dependency_failure', 'sequence_key'];
    -- Go's unicode.IsSpace, which strings.TrimSpace trims from a kind.
    space constant text := E' \t\n\u000b\f\r' || U&'\0085\00A0\1680\2000\2001\2002\2003\2004\2005\2006\2007\2008\2009\200A\2028\2029\202F\205F\3000';
    -- termsafe.Unsafe: C0, DEL, C1, bidirectional controls, U+2028/9.
    unsafe_re constant text := '[\x01-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]';
    rfc3339 constant text := '^(\d{4})-\d{2}-\d{2}T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$';
    -- The settings of ingest_enqueue_batch (the one place an operator sets
    -- them, for both functions).
    stream text;
    max_payload int;

    n int;
    us bigint;
    el jsonb;
    pre text;
    f text;
    m text;
    code text;
    v jsonb;
    t text;
    c text;

    k text;
    canon text;
    key text;
    att int;
    run_at timestamptz;
    delay bigint;
    timeout bigint;
    tp text;
    dd boolean;
    prio smallint;
    grp text;

    ids uuid[] := '{}';
    kinds text[] := '{}';
    payloads text[] := '{}';
    shas text[] := '{}';
    keys text[] := '{}';
    atts int[] := '{}';
    dues timestamptz[] := '{}';
    timeouts bigint[] := '{}';
    tps text[] := '{}';
    dedups boolean[] := '{}';
    prios smallint[] := '{}';
    groups text[] := '{}';
    timed boolean[] := '{}';
    held boolean[];
    keyed boolean := false;
    any_dedup boolean := false;
    resolved uuid[];
    same int[];
    hit uuid;
    ins uuid[];
    res uuid[];
BEGIN
    SELECT (SELECT substr(x, 15) FROM unnest(proconfig) AS x WHERE x LIKE 'ingest.stream=%'),
           (SELECT substr(x, 26) FROM unnest(proconfig) AS x WHERE x LIKE 'ingest.max\_payload\_bytes=%')::int
    INTO stream, max_payload
    FROM pg_proc WHERE oid = 'ingest_enqueue_batch(jsonb)'::regprocedure;
    IF tasks IS NULL OR jsonb_typeof(tasks) <> 'array' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'tasks',
            MESSAGE = format('tasks must be a JSON array, got %s', coalesce(jsonb_typeof(tasks), 'NULL'));
    END IF;
    IF stream IS NULL OR stream = '' OR max_payload IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'ingest_enqueue_batch(jsonb) lacks its settings ingest.stream and ingest.max_payload_bytes',
            HINT = 'ALTER FUNCTION ingest_enqueue_batch(jsonb) SET ingest.stream = ''ingest:tasks'' (and SET ingest.max_payload_bytes = ''1048576'')';
    END IF;
    n := jsonb_array_length(tasks);

    FOR pos IN 0 .. n - 1 LOOP
        el := tasks->pos;
        f := NULL; m := NULL; code := '22023';

        IF jsonb_typeof(el) <> 'object' THEN
            f := ''; m := format('the task must be a JSON object, got %s', jsonb_typeof(el));
        ELSIF (el - fields) <> '{}'::jsonb THEN
            SELECT x INTO f FROM jsonb_object_keys(el - fields) AS x ORDER BY x COLLATE "C" LIMIT 1;
            m := format('unknown field "%s"', f);
        END IF;

        -- The types of the fields, as the API's JSON decoding checks them
        -- (a JSON null is an absent field): at once when they are right,
        -- field by field to name the wrong one.
        IF m IS NULL AND NOT (
            coalesce(jsonb_typeof(el->'kind'), 'null') IN ('string', 'null')
            AND coalesce(jsonb_typeof(el->'idempotency_key'), 'null') IN ('string', 'null')
            AND coalesce(jsonb_typeof(el->'run_at'), 'null') IN ('string', 'null')
            AND coalesce(jsonb_typeof(el->'traceparent'), 'null') IN ('string', 'null')
            AND coalesce(jsonb_typeof(el->'group_key'), 'null') IN ('string', 'null')
            AND coalesce(jsonb_typeof(el->'dedup_by_payload'), 'null') IN ('boolean', 'null')
            AND (el->'max_attempts' IS NULL OR (el->>'max_attempts') IS NULL OR (el->>'max_attempts') ~ '^-?\d{1,18}$')
            AND (el->'delay_ms' IS NULL OR (el->>'delay_ms') IS NULL OR (el->>'delay_ms') ~ '^-?\d{1,18}$')
            AND (el->'timeout_ms' IS NULL OR (el->>'timeout_ms') IS NULL OR (el->>'timeout_ms') ~ '^-?\d{1,18}$')
            AND (el->'priority' IS NULL OR (el->>'priority') IS NULL OR (el->>'priority') ~ '^-?\d{1,18}$')
            AND jsonb_typeof(el->'priority') IS DISTINCT FROM 'string'
            AND jsonb_typeof(el->'max_attempts') IS DISTINCT FROM 'string'
            AND jsonb_typeof(el->'delay_ms') IS DISTINCT FROM 'string'
            AND jsonb_typeof(el->'timeout_ms') IS DISTINCT FROM 'string') THEN
            FOREACH c IN ARRAY fields LOOP
                v := el->c;
                t := jsonb_typeof(v);
                CONTINUE WHEN t IS NULL OR t = 'null' OR c = 'payload';
                IF c IN ('max_attempts', 'delay_ms', 'timeout_ms', 'priority') THEN
                    -- Not a JSON number, a fraction, or beyond int64.
                    IF t <> 'number' OR v::text !~ '^-?\d{1,19}$'
                       OR v::text::numeric NOT BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
                        m := format('%s must be a whole number from %s to %s, got %s', c,
                            CASE c WHEN 'max_attempts' THEN att_min WHEN 'priority' THEN 1 ELSE 0 END,
                            CASE c WHEN 'max_attempts' THEN att_max WHEN 'delay_ms' THEN delay_max WHEN 'priority' THEN 4 ELSE timeout_max END,
                            CASE t WHEN 'number' THEN 'number ' || v::text WHEN 'boolean' THEN 'bool' ELSE t END);
                    END IF;
                ELSIF c = 'dedup_by_payload' THEN
                    IF t <> 'boolean' THEN
                        m := format('%s must be a JSON boolean, got %s', c, t);
                    END IF;
                ELSIF t <> 'string' THEN
                    m := format('%s must be a JSON string, got %s', c, CASE t WHEN 'boolean' THEN 'bool' ELSE t END);
                END IF;
                IF m IS NOT NULL THEN
                    f := c;
                    EXIT;
                END IF;
            END LOOP;
        END IF;

        IF m IS NULL THEN
            v := el->'payload';
            IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
                f := 'payload'; m := 'payload is required (any JSON value but null)';
            ELSIF jsonb_typeof(el->'max_attempts') = 'number' AND (el->>'max_attempts')::bigint NOT BETWEEN att_min AND att_max THEN
                f := 'max_attempts';
                m := format('max_attempts must be a whole number from %s to %s, got %s', att_min, att_max, el->>'max_attempts');
            ELSIF jsonb_typeof(el->'run_at') = 'string' AND el->>'run_at' <> '' AND el->>'run_at' !~ rfc3339 THEN
                f := 'run_at';
                m := format('run_at "%s" is not an RFC 3339 time (e.g. 2026-01-02T15:04:05Z)', el->>'run_at');
            ELSIF jsonb_typeof(el->'delay_ms') = 'number' AND (el->>'delay_ms')::bigint NOT BETWEEN 0 AND delay_max THEN
                f := 'delay_ms';
                m := format('delay_ms must be a whole number from 0 to %s, got %s', delay_max, el->>'delay_ms');
            ELSIF jsonb_typeof(el->'timeout_ms') = 'number' AND (el->>'timeout_ms')::bigint NOT BETWEEN 0 AND timeout_max THEN
                f := 'timeout_ms';
                m := format('timeout_ms must be a whole number from 0 to %s, got %s', timeout_max, el->>'timeout_ms');
            ELSIF jsonb_typeof(el->'priority') = 'number' AND (el->>'priority')::bigint NOT BETWEEN 1 AND 4 THEN
                -- task.PriorityRange
                f := 'priority';
                m := format('priority must be a whole number from 1 to 4, got %s', el->>'priority');
            END IF;
        END IF;

        IF m IS NULL THEN
            k := btrim(coalesce(el->>'kind', ''), space);
            key := coalesce(el->>'idempotency_key', '');
            att := (el->>'max_attempts')::int;
            delay := coalesce((el->>'delay_ms')::bigint, 0);
            timeout := coalesce((el->>'timeout_ms')::bigint, 0);
            tp := coalesce(el->>'traceparent', '');
            dd := coalesce((el->>'dedup_by_payload')::boolean, false);
            grp := coalesce(el->>'group_key', '');
            -- The default, 2, is stored as NULL (migration 00019).
            prio := NULLIF((el->>'priority')::smallint, 2);
            t := coalesce(el->>'run_at', '');
            run_at := NULL;
            IF t <> '' AND substr(t, 1, 4) <> '0000' THEN
                -- A date that does not exist (February 30) is no time;
                -- checked here, not by a failing cast (no subtransaction).
                IF substr(t, 9, 2)::int BETWEEN 1 AND extract(day FROM
                    make_date(substr(t, 1, 4)::int, greatest(least(substr(t, 6, 2)::int, 12), 1), 1) + interval '1 month - 1 day')
                   AND substr(t, 6, 2)::int BETWEEN 1 AND 12 THEN
                    run_at := t::timestamptz;
                ELSE
                    f := 'run_at';
                    m := format('run_at "%s" is not an RFC 3339 time (e.g. 2026-01-02T15:04:05Z)', t);
                END IF;
            END IF;
        END IF;

        -- The checks of task.NewTask.Validate, in its order.
        IF m IS NULL THEN
            IF k = '' THEN
                f := 'kind'; m := 'kind is required';
            ELSIF octet_length(k) > max_kind THEN
                f := 'kind'; m := format('kind is longer than %s bytes', max_kind);
            ELSIF k ~ unsafe_re THEN
                f := 'kind'; c := substring(k FROM unsafe_re);
                m := format('kind must not hold control or bidirectional characters, got %s at byte %s',
                    ingest_enqueue_escape(c), octet_length(substring(k FROM '^[^' || substr(unsafe_re, 2) || '*')));
            ELSIF octet_length(key) > max_key THEN
                f := 'idempotency_key'; m := format('idempotency_key is longer than %s bytes', max_key);
            ELSIF key ~ unsafe_re THEN
                f := 'idempotency_key'; c := substring(key FROM unsafe_re);
                m := format('idempotency_key must not hold control or bidirectional characters, got %s at byte %s',
                    ingest_enqueue_escape(c), octet_length(substring(key FROM '^[^' || substr(unsafe_re, 2) || '*')));
            ELSIF octet_length(grp) > 200 THEN
                f := 'group_key'; m := 'group_key is longer than 200 bytes';
            ELSIF grp ~ unsafe_re THEN
                f := 'group_key'; c := substring(grp FROM unsafe_re);
                m := format('group_key must not hold control or bidirectional characters, got %s at byte %s',
                    ingest_enqueue_escape(c), octet_length(substring(grp FROM '^[^' || substr(unsafe_re, 2) || '*')));
            ELSIF grp LIKE ' %' OR grp LIKE '% ' THEN
                f := 'group_key'; m := 'group_key must not begin or end with a space';
            ELSIF tp <> '' AND NOT ingest_enqueue_valid_traceparent(tp) THEN
                f := 'traceparent';
                m := format('traceparent "%s" is not a valid W3C traceparent', ingest_enqueue_clip(tp, 64));
            ELSIF delay > 0 AND t <> '' THEN
                f := 'run_at'; m := 'run_at and delay_ms are exclusive: set at most one';
            ELSIF t <> '' AND substr(t, 1, 4) = '0000' THEN
                f := 'run_at';
                m := format('run_at %s is out of range (year 1 or later)', ingest_enqueue_rfc3339(t));
            ELSIF run_at > horizon THEN
                f := 'run_at';
                m := format('run_at %s is beyond the scheduling horizon: at most %s days (about %s years) from now',
                    ingest_enqueue_rfc3339(t), horizon_days, horizon_days / 365);
            ELSE
                canon := ingest_canonical_json(el->'payload');
                IF octet_length(canon) > max_payload THEN
                    f := 'payload'; code := '54000';
                    m := format('payload is %s bytes, the limit is %s', octet_length(canon), max_payload);
                END IF;
            END IF;
        END IF;

        IF m IS NOT NULL THEN
            pre := CASE WHEN numbered THEN format('task %s: ', pos) ELSE '' END;
        END IF;
        IF m LIKE 'unknown field%' THEN
            RAISE EXCEPTION USING ERRCODE = code, COLUMN = f, MESSAGE = pre || m,
                HINT = 'the fields are ' || array_to_string(fields || entry_fields, ', ');
        ELSIF m IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = code, COLUMN = f, MESSAGE = pre || m;
        END IF;

        -- A UUIDv7 (RFC 9562) as google/uuid's NewV7 makes them in Go: 48
        -- bits of Unix milliseconds, the version, 12 bits of sub-millisecond
        -- fraction (so ids follow their creation), then random bits with
        -- the variant.
        us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
        ids := ids || encode(overlay(uuid_send(gen_random_uuid()) PLACING
            int8send(((us / 1000) << 16) | 28672 | ((us % 1000) * 4096 / 1000)) FROM 1 FOR 8), 'hex')::uuid;
        kinds := kinds || k;
        payloads := payloads || canon;
        shas := shas || encode(sha256(convert_to(canon, 'UTF8')), 'hex');
        keys := keys || key;
        atts := atts || coalesce(att, 0);
        -- When a delayed task is due (its next_retry_at and due_at; NULL:
        -- due now), from the database's clock as in task/create.go.
        dues := dues || CASE WHEN run_at > now() THEN run_at
                             WHEN delay > 0 THEN now() + delay * interval '1 millisecond' END;
        timeouts := timeouts || timeout;
        tps := tps || tp;
        dedups := dedups || dd;
        groups := groups || grp;
        timed := timed || (run_at IS NOT NULL OR delay > 0);
        prios := prios || prio;
        keyed := keyed OR key <> '';
        any_dedup := any_dedup OR dd;
    END LOOP;
    IF n = 0 THEN
        RETURN '{}';
    END IF;

    -- resolved[i]: the existing task item i turned out to be (payload
    -- dedup); NULL: to insert. same[i]: the first item of the batch with
    -- item i's dedup key (i itself for the first).
    resolved := array_fill(NULL::uuid, ARRAY[n]);
    IF any_dedup THEN
        -- As the Go store: one advisory lock per (kind, payload_sha), taken
        -- in one order, then an existing non-DEAD dedup task, else the
        -- first item of the batch with the same key.
        PERFORM pg_advisory_xact_lock(hashtextextended(x, 0))
        FROM (SELECT DISTINCT kinds[i] || '/' || shas[i] AS x FROM generate_subscripts(ids, 1) AS i WHERE dedups[i]) d
        ORDER BY x COLLATE "C";
        same := ARRAY(SELECT CASE WHEN dedups[i] THEN min(i) OVER (PARTITION BY dedups[i], kinds[i], shas[i]) END
                      FROM generate_subscripts(ids, 1) AS i ORDER BY i);
        FOR i IN 1 .. n LOOP
            IF same[i] = i THEN
                SELECT id INTO hit FROM ingest_task
                WHERE ingest_task.kind = kinds[i] AND payload_sha = shas[i] AND dedup AND status <> 'DEAD'
                ORDER BY created_at LIMIT 1;
                resolved[i] := hit;
            ELSIF same[i] IS NOT NULL THEN
                resolved[i] := ids[i]; -- not inserted: the first one's task, below
            END IF;
        END LOOP;
    END IF;

    -- A task due now with a group, beyond the room its group's window
    -- leaves, is created parked, as task/create.go does (holdBack and
    -- createRoomSQL in task/group.go): the groups' advisory locks in the
    -- Go store's names and order, so that concurrent creators of a group
    -- count its window one after the other; then each group's room (none
    -- while it has parked tasks: they go first; else its window, the
    -- kind's group_window or 100, times the group's weight, less its tasks
    -- in the stream or running: ingest_group_admitted), given to the
    -- batch's tasks in order.
    held := array_fill(false, ARRAY[n]);
    IF EXISTS (SELECT 1 FROM generate_subscripts(ids, 1) AS i WHERE groups[i] <> '' AND NOT timed[i] AND resolved[i] IS NULL) THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('ingest-group/' || x.k || '/' || x.g, 0))
        FROM (SELECT DISTINCT kinds[i] AS k, groups[i] AS g FROM generate_subscripts(ids, 1) AS i
              WHERE groups[i] <> '' AND NOT timed[i] AND resolved[i] IS NULL) x
        ORDER BY x.k, x.g;
        WITH items AS (
            SELECT i, kinds[i] AS k, groups[i] AS g, (groups[i] <> '' AND NOT timed[i] AND resolved[i] IS NULL) AS holdable
            FROM generate_subscripts(ids, 1) AS i
        ), ranked AS (
            SELECT items.*, row_number() OVER (PARTITION BY k, g, holdable ORDER BY i) AS rn FROM items
        ), room AS (
            SELECT x.k, x.g,
                CASE WHEN EXISTS (SELECT 1 FROM ingest_task p WHERE p.kind = x.k AND p.group_key = x.g AND p.parked_at IS NOT NULL) THEN 0
                     ELSE greatest(
                        coalesce((SELECT nullif(w.group_window, 0) FROM ingest_kind w WHERE w.kind = x.k), 100)
                            * coalesce((SELECT (w.group_weights ->> x.g)::int FROM ingest_kind w WHERE w.kind = x.k), 1)
                        - ingest_group_admitted(x.k, x.g), 0) END AS room
            FROM (SELECT DISTINCT k, g FROM items WHERE holdable) x
        )
        SELECT array_agg(coalesce(r.holdable AND r.rn > room.room, false) ORDER BY r.i) INTO held
        FROM ranked r LEFT JOIN room ON room.k = r.k AND room.g = r.g;
    END IF;

    -- The insert of task/create.go (insertTasksSQL), its audit rows and
    -- outbox rows, in one statement. A task whose id is below the pending
    -- low-water cutoff is created lingering (migration 00025); a task held
    -- back by its group's window is created parked, without an outbox row
    -- (the release that unparks it writes one).
    WITH inserted AS (
        INSERT INTO ingest_task AS it (id, kind, payload, payload_sha, idempotency_key, max_attempts, next_retry_at, due_at, timeout_ms, traceparent, dedup, priority, group_key,
            parked_at, lingering)
        SELECT id, kind, payload::jsonb, sha, NULLIF(key, ''), NULLIF(max_attempts, 0), due, due,
            NULLIF(timeout_ms, 0), NULLIF(traceparent, ''), dedup, priority, NULLIF(grp, ''),
            CASE WHEN hold THEN now() END,
            CASE WHEN id < (SELECT ingest_task_pending_cutoff()) THEN true END
        FROM unnest(ids, kinds, payloads, shas, keys, atts, dues, timeouts, tps, dedups, prios, resolved, groups, held)
                WITH ORDINALITY AS s(id, kind, payload, sha, key, max_attempts, due, timeout_ms, traceparent, dedup, priority, done, grp, hold, ord)
        WHERE done IS NULL
        ORDER BY ord
        ON CONFLICT (kind, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING it.id, it.next_retry_at, it.parked_at
    ), audit AS (
        INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, message)
        SELECT id, NULL, 'QUEUED', 0, 'created' FROM inserted ORDER BY id
    ), outbox AS (
        INSERT INTO outbox_event (task_id, stream, next_retry_at)
        SELECT id, stream, coalesce(next_retry_at, now()) FROM inserted WHERE parked_at IS NULL ORDER BY id
    )
    SELECT array_agg(id) INTO ins FROM inserted;

    -- Each item's task: its own when inserted, else the existing one (the
    -- payload dedup's, or the holder of its idempotency key: a task that
    -- existed, or an earlier item of this batch).
    IF coalesce(array_length(ins, 1), 0) = n THEN
        RETURN ids; -- all new
    END IF;
    res := ARRAY(
        SELECT CASE WHEN s.id IN (SELECT unnest(ins)) THEN s.id
                    ELSE coalesce(s.done, (SELECT tt.id FROM ingest_task tt WHERE tt.kind = s.kind AND tt.idempotency_key = s.key)) END
        FROM unnest(ids, kinds, keys, resolved) WITH ORDINALITY AS s(id, kind, key, done, ord)
        ORDER BY s.ord);
    IF any_dedup THEN
        FOR i IN 1 .. n LOOP
            IF same[i] < i THEN
                res[i] := res[same[i]];
            END IF;
        END LOOP;
    END IF;
    RETURN res;
END;
$$;
-- +goose StatementEnd
