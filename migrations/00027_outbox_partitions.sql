-- +goose Up
-- The outbox partitioned by id ranges that stand for time
-- (docs/ARCHITECTURE.md §3, docs/OPERATIONS.md "Retention"): outbox_event
-- becomes a table partitioned by RANGE (id), so that retention drops a
-- whole partition of old rows instead of deleting SENT rows one by one.
--
-- Why id and not created_at: every statement of the relay and of the
-- rescuer names rows by id (the marking of a published batch, the latest
-- row of a task), and with RANGE (id) each such lookup reads the one
-- partition that holds the id; partitioned by created_at, the primary key
-- would become (id, created_at) and each lookup by id would probe every
-- partition. ids come from one sequence in creation order, so a range of
-- ids is a range of time: the leader opens the ranges ahead from the rate
-- at which ids were taken (outbox_event_extend), each about a Width of
-- time wide.
--
-- The existing table, with its rows, indexes and settings, becomes the
-- first partition, outbox_event_history, holding every id taken so far (no
-- row is copied; under the lock the attach reads the table once to check
-- the bound, which writers wait for). Partitions follow, two days ahead
-- at the rate of the last day, and a DEFAULT partition takes any row no
-- partition covers, so that an insert never fails for want of a
-- partition; the next extension moves such rows into the partition it
-- creates for them. The DEFAULT partition also keeps the rows of tasks
-- that outlived the partition they were written in
-- (ingest_partition_retire).
--
-- The parent has the table's primary key (id) and indexes, as partitioned
-- indexes of the same names: the table's own become those of its
-- partition (renamed outbox_event_history_*), and each new partition gets
-- its own when it is attached. Whatever triggers the table has (the
-- NOTIFY of new rows) are carried over to the parent, built from the
-- catalog with their enabled state, and so are its grants, as in 00024.
-- The functions that list partitions with their bounds are PL/pgSQL, so
-- that no caller's condition on a bound cast to the table's type (WHERE
-- hi IS NOT NULL) is pushed down to the catalog scan and evaluated on the
-- bounds of another table's partitions (a timestamp cast to bigint, or an
-- id to timestamptz), which fails. ingest_task_transition_partitions, an
-- SQL function until now, is redefined so too: the outbox's partitions
-- are the first other partitions in the catalog.
-- +goose StatementBegin
CREATE FUNCTION ingest_partition_bounds(parent regclass)
RETURNS TABLE (name text, lo text, hi text, is_default boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT c.relname::text,
           CASE WHEN b.expr = 'DEFAULT' OR b.expr LIKE 'FOR VALUES FROM (MINVALUE)%' THEN NULL
                ELSE substring(b.expr FROM $re$FROM \('([^']+)'\)$re$) END,
           CASE WHEN b.expr = 'DEFAULT' OR b.expr LIKE '%TO (MAXVALUE)' THEN NULL
                ELSE substring(b.expr FROM $re$TO \('([^']+)'\)$re$) END,
           b.expr = 'DEFAULT'
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS expr) b
    WHERE i.inhparent = parent;
END;
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION ingest_partition_bounds(regclass) IS
    'the partitions of a table partitioned by RANGE with their bounds [lo, hi) as text; NULL: unbounded';

-- +goose StatementBegin
CREATE FUNCTION outbox_event_partitions()
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
CREATE OR REPLACE FUNCTION ingest_task_transition_partitions()
RETURNS TABLE (name text, lo timestamptz, hi timestamptz, is_default boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT b.name,
           CASE WHEN b.is_default OR b.lo IS NULL THEN '-infinity'::timestamptz ELSE b.lo::timestamptz END,
           CASE WHEN b.is_default OR b.hi IS NULL THEN 'infinity'::timestamptz ELSE b.hi::timestamptz END,
           b.is_default
    FROM ingest_partition_bounds('ingest_task_transition') b
    ORDER BY 3, 2;
END;
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION outbox_event_partitions() IS
    'the partitions of outbox_event with their id bounds [lo, hi); NULL: unbounded (the first partition''s lo, the DEFAULT partition''s both)';

-- outbox_event_last_id is the last id the sequence handed out (0: none):
-- every id up to it belongs to a row written or being written, and no
-- later row takes one (the sequence caches no ids: CACHE 1).
-- +goose StatementBegin
CREATE FUNCTION outbox_event_last_id() RETURNS bigint
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

-- outbox_event_index builds the indexes of a partition before it is
-- attached, each named after it as the partition of the table from before
-- the partitioning has them (<partition>_pkey, _claim_idx, _task_idx,
-- _stream_id_idx, _created_idx): ATTACH takes them as the partitions of
-- the parent's indexes of the same definition.
-- +goose StatementBegin
CREATE FUNCTION outbox_event_index(part text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I PRIMARY KEY (id)', part, part || '_pkey');
    EXECUTE format($f$CREATE INDEX %I ON %I (next_retry_at, id) WHERE status IN ('NEW', 'RETRYING')$f$, part || '_claim_idx', part);
    EXECUTE format('CREATE INDEX %I ON %I (task_id, id)', part || '_task_idx', part);
    EXECUTE format('CREATE INDEX %I ON %I (stream, stream_id) WHERE stream_id IS NOT NULL', part || '_stream_id_idx', part);
    EXECUTE format('CREATE INDEX %I ON %I (created_at DESC)', part || '_created_idx', part);
END;
$$;
-- +goose StatementEnd

-- outbox_event_extend opens the partitions from the upper bound of the
-- newest one until they reach the ids that ahead of time takes at the
-- rate ids were taken over the last width (at least min_ids past the last
-- id taken), each the ids that width of time takes (at least min_ids),
-- and returns how many it created. The rate is read from the oldest row
-- written within the last width (outbox_event_created_idx) and the
-- sequence. Each new partition is built alone (the settings of the newest
-- partition, a CHECK of its bounds), takes the rows the DEFAULT partition
-- holds for its range, gets its indexes (outbox_event_index) and is
-- attached: ATTACH takes SHARE UPDATE EXCLUSIVE on the parent, which writers of
-- outbox rows do not wait on.
-- +goose StatementBegin
CREATE FUNCTION outbox_event_extend(width interval, ahead interval, min_ids bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    last bigint := outbox_event_last_id();
    since_id bigint;
    since_at timestamptz;
    rate float8 := 0;
    size bigint;
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
    IF since_at < now() - interval '1 minute' THEN
        rate := greatest(last - since_id, 0) / extract(epoch FROM now() - since_at);
    END IF;
    size := greatest(min_ids, ceil(rate * extract(epoch FROM width))::bigint);
    goal := last + greatest(min_ids, ceil(rate * extract(epoch FROM ahead))::bigint);
    SELECT p.name, p.hi INTO newest, hi FROM outbox_event_partitions() p
    WHERE NOT p.is_default AND p.hi IS NOT NULL ORDER BY p.hi DESC LIMIT 1;
    IF hi IS NULL THEN
        hi := last + 1;
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
        IF to_regclass('outbox_event_default') IS NOT NULL THEN
            EXECUTE format('WITH m AS (DELETE FROM outbox_event_default WHERE id >= %s AND id < %s RETURNING *)
                            INSERT INTO %I SELECT * FROM m', lo, hi, part);
        END IF;
        PERFORM outbox_event_index(part);
        EXECUTE format('ALTER TABLE outbox_event ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)', part, lo, hi);
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', part, part || '_bounds');
        n := n + 1;
    END LOOP;
    RETURN n;
END;
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION outbox_event_extend(interval, interval, bigint) IS
    'creates the partitions of outbox_event, each the ids width of time takes, from the newest one''s end until they reach the ids ahead of time takes; returns how many';

-- ingest_partition_retire drops the partition part of parent (a table
-- partitioned by time with a DEFAULT partition and a task_id column)
-- once its rows are no longer written to, keeping the rows of the tasks
-- that still exist: up to keep_max of them are copied first (read without
-- blocking writers), then, under ACCESS EXCLUSIVE on the parent (bounded
-- by the caller's lock_timeout), those whose task has meanwhile gone are
-- left out, the partition is detached, the rows are written into the
-- DEFAULT partition (by name: no trigger of the parent fires, no row is
-- announced again) and the partition is dropped. It returns how many rows
-- it kept, or -1, dropping nothing, when more than keep_max rows would
-- have to be kept (the partition is still mostly needed).
-- +goose StatementBegin
CREATE FUNCTION ingest_partition_retire(parent regclass, part regclass, keep_max bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    dflt regclass;
    cols text;
    n bigint;
    gone bigint;
BEGIN
    SELECT nullif(pt.partdefid, 0)::regclass INTO dflt FROM pg_partitioned_table pt WHERE pt.partrelid = parent;
    IF dflt IS NULL THEN
        RAISE EXCEPTION '% has no DEFAULT partition to keep rows in', parent;
    END IF;
    IF part = dflt OR NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhparent = parent AND i.inhrelid = part) THEN
        RAISE EXCEPTION '% is not a partition of % that may be dropped', part, parent;
    END IF;
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO cols FROM pg_attribute a
    WHERE a.attrelid = parent AND a.attnum > 0 AND NOT a.attisdropped;
    EXECUTE format('CREATE TEMP TABLE ingest_partition_kept ON COMMIT DROP AS
                    SELECT %s FROM %s r WHERE EXISTS (SELECT 1 FROM ingest_task t WHERE t.id = r.task_id) LIMIT %s',
                   cols, part, keep_max + 1);
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > keep_max THEN
        DROP TABLE ingest_partition_kept;
        RETURN -1;
    END IF;
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', parent);
    DELETE FROM ingest_partition_kept k WHERE NOT EXISTS (SELECT 1 FROM ingest_task t WHERE t.id = k.task_id);
    GET DIAGNOSTICS gone = ROW_COUNT;
    EXECUTE format('ALTER TABLE %s DETACH PARTITION %s', parent, part);
    EXECUTE format('INSERT INTO %s (%s) SELECT %s FROM ingest_partition_kept', dflt, cols, cols);
    EXECUTE format('DROP TABLE %s', part);
    DROP TABLE ingest_partition_kept;
    RETURN n - gone;
END;
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION ingest_partition_retire(regclass, regclass, bigint) IS
    'drops a partition, moving the rows of the tasks that still exist (at most keep_max, else -1 and nothing dropped) into the DEFAULT partition; returns how many it moved';

-- +goose StatementBegin
DO $$
DECLARE
    trig record;
    tnames text[] := '{}';
    tenabled text[] := '{}';
    tdefs text[] := '{}';
    i integer;
    g record;
    grants text[] := '{}';
    s text;
    idx record;
    cut bigint;
BEGIN
    LOCK TABLE outbox_event IN ACCESS EXCLUSIVE MODE;
    FOR trig IN SELECT t.tgname, t.tgenabled, pg_get_triggerdef(t.oid) AS def FROM pg_trigger t
                WHERE t.tgrelid = 'outbox_event'::regclass AND NOT t.tgisinternal ORDER BY t.tgname LOOP
        tnames := tnames || trig.tgname::text;
        tenabled := tenabled || trig.tgenabled::text;
        tdefs := tdefs || trig.def;
        EXECUTE format('DROP TRIGGER %I ON outbox_event', trig.tgname);
    END LOOP;
    FOR g IN SELECT a.privilege_type, a.grantee, a.is_grantable FROM pg_class c
             CROSS JOIN LATERAL aclexplode(c.relacl) a
             WHERE c.oid = 'outbox_event'::regclass AND a.grantee <> c.relowner LOOP
        grants := grants || format('GRANT %s ON outbox_event TO %s%s', g.privilege_type,
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    -- Under the lock every row written holds an id up to the sequence's
    -- last, and no other id is taken until the table is partitioned.
    cut := greatest(outbox_event_last_id(), (SELECT max(id) FROM outbox_event), 0) + 1;

    ALTER TABLE outbox_event RENAME TO outbox_event_history;
    FOR idx IN SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
               WHERE x.indrelid = 'outbox_event_history'::regclass LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', idx.relname, replace(idx.relname, 'outbox_event_', 'outbox_event_history_'));
    END LOOP;
    CREATE TABLE outbox_event (LIKE outbox_event_history INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
        PARTITION BY RANGE (id);
    ALTER SEQUENCE outbox_event_id_seq OWNED BY outbox_event.id;
    ALTER TABLE outbox_event_history ALTER COLUMN id DROP DEFAULT;
    EXECUTE format('ALTER TABLE outbox_event ATTACH PARTITION outbox_event_history FOR VALUES FROM (MINVALUE) TO (%s)', cut);
    -- The partitioned indexes take the partition's indexes of the same
    -- definition as their own, without building them.
    ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_pkey PRIMARY KEY (id);
    CREATE INDEX outbox_event_claim_idx ON outbox_event (next_retry_at, id) WHERE status IN ('NEW', 'RETRYING');
    CREATE INDEX outbox_event_task_idx ON outbox_event (task_id, id);
    CREATE INDEX outbox_event_stream_id_idx ON outbox_event (stream, stream_id) WHERE stream_id IS NOT NULL;
    CREATE INDEX outbox_event_created_idx ON outbox_event (created_at DESC);
    CREATE TABLE outbox_event_default (LIKE outbox_event INCLUDING CONSTRAINTS);
    SELECT array_to_string(c.reloptions, ', ') INTO s FROM pg_class c WHERE c.oid = 'outbox_event_history'::regclass;
    IF s IS NOT NULL THEN
        EXECUTE format('ALTER TABLE outbox_event_default SET (%s)', s);
    END IF;
    PERFORM outbox_event_index('outbox_event_default');
    ALTER TABLE outbox_event ATTACH PARTITION outbox_event_default DEFAULT;
    PERFORM outbox_event_extend(interval '1 day', interval '2 days', 10000);

    FOREACH s IN ARRAY grants LOOP
        EXECUTE s;
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(tdefs, 1), 0) LOOP
        EXECUTE tdefs[i];
        IF tenabled[i] <> 'O' THEN
            EXECUTE format('ALTER TABLE outbox_event %s TRIGGER %I',
                CASE tenabled[i] WHEN 'D' THEN 'DISABLE' WHEN 'R' THEN 'ENABLE REPLICA' ELSE 'ENABLE ALWAYS' END, tnames[i]);
        END IF;
    END LOOP;
END;
$$;
-- +goose StatementEnd
COMMENT ON TABLE outbox_event IS
    'one row per publication of a task; partitioned by RANGE (id), ranges opened ahead by time: retention drops whole partitions';

-- +goose Down
-- A plain table again, with the rows of the tasks that still exist (the
-- schema before this migration deletes a task's outbox rows with it), its
-- primary key, indexes and settings, and the parent's triggers and
-- grants.
-- +goose StatementBegin
DO $$
DECLARE
    trig record;
    tnames text[] := '{}';
    tenabled text[] := '{}';
    tdefs text[] := '{}';
    i integer;
    g record;
    grants text[] := '{}';
    s text;
    opts text[];
BEGIN
    LOCK TABLE outbox_event IN ACCESS EXCLUSIVE MODE;
    FOR trig IN SELECT t.tgname, t.tgenabled, pg_get_triggerdef(t.oid) AS def FROM pg_trigger t
                WHERE t.tgrelid = 'outbox_event'::regclass AND NOT t.tgisinternal AND t.tgparentid = 0
                ORDER BY t.tgname LOOP
        tnames := tnames || trig.tgname::text;
        tenabled := tenabled || trig.tgenabled::text;
        tdefs := tdefs || trig.def;
    END LOOP;
    FOR g IN SELECT a.privilege_type, a.grantee, a.is_grantable FROM pg_class c
             CROSS JOIN LATERAL aclexplode(c.relacl) a
             WHERE c.oid = 'outbox_event'::regclass AND a.grantee <> c.relowner LOOP
        grants := grants || format('GRANT %s ON outbox_event TO %s%s', g.privilege_type,
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    SELECT c.reloptions INTO opts FROM outbox_event_partitions() p
    JOIN pg_class c ON c.oid = to_regclass(quote_ident(p.name))
    WHERE NOT p.is_default ORDER BY p.hi DESC NULLS LAST LIMIT 1;

    CREATE TABLE outbox_event_plain (LIKE outbox_event INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
    INSERT INTO outbox_event_plain
    SELECT * FROM outbox_event o WHERE EXISTS (SELECT 1 FROM ingest_task t WHERE t.id = o.task_id) ORDER BY o.id;
    ALTER SEQUENCE outbox_event_id_seq OWNED BY outbox_event_plain.id;
    DROP TABLE outbox_event;
    ALTER TABLE outbox_event_plain RENAME TO outbox_event;
    ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_pkey PRIMARY KEY (id);
    CREATE INDEX outbox_event_claim_idx ON outbox_event (next_retry_at, id) WHERE status IN ('NEW', 'RETRYING');
    CREATE INDEX outbox_event_task_idx ON outbox_event (task_id, id);
    CREATE INDEX outbox_event_stream_id_idx ON outbox_event (stream, stream_id) WHERE stream_id IS NOT NULL;
    CREATE INDEX outbox_event_created_idx ON outbox_event (created_at DESC);
    IF opts IS NOT NULL THEN
        EXECUTE format('ALTER TABLE outbox_event SET (%s)', array_to_string(opts, ', '));
    END IF;
    FOREACH s IN ARRAY grants LOOP
        EXECUTE s;
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(tdefs, 1), 0) LOOP
        EXECUTE tdefs[i];
        IF tenabled[i] <> 'O' THEN
            EXECUTE format('ALTER TABLE outbox_event %s TRIGGER %I',
                CASE tenabled[i] WHEN 'D' THEN 'DISABLE' WHEN 'R' THEN 'ENABLE REPLICA' ELSE 'ENABLE ALWAYS' END, tnames[i]);
        END IF;
    END LOOP;
END;
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_task_transition_partitions()
RETURNS TABLE (name text, lo timestamptz, hi timestamptz, is_default boolean)
LANGUAGE sql STABLE AS $$
    SELECT c.relname::text,
           CASE WHEN b.expr = 'DEFAULT' OR b.expr LIKE 'FOR VALUES FROM (MINVALUE)%' THEN '-infinity'::timestamptz
                ELSE substring(b.expr FROM $re$FROM \('([^']+)'\)$re$)::timestamptz END,
           CASE WHEN b.expr = 'DEFAULT' OR b.expr LIKE '%TO (MAXVALUE)' THEN 'infinity'::timestamptz
                ELSE substring(b.expr FROM $re$TO \('([^']+)'\)$re$)::timestamptz END,
           b.expr = 'DEFAULT'
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS expr) b
    WHERE i.inhparent = 'ingest_task_transition'::regclass
    ORDER BY 3, 2
$$;
-- +goose StatementEnd
DROP FUNCTION ingest_partition_retire(regclass, regclass, bigint);
DROP FUNCTION outbox_event_extend(interval, interval, bigint);
DROP FUNCTION outbox_event_index(text);
DROP FUNCTION outbox_event_last_id();
DROP FUNCTION outbox_event_partitions();
DROP FUNCTION ingest_partition_bounds(regclass);
