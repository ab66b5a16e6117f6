-- +goose Up
-- The audit table partitioned by time (docs/ARCHITECTURE.md §3.1,
-- docs/OPERATIONS.md "Retention"): ingest_task_transition becomes a table
-- partitioned by RANGE (created_at), so that retention drops a whole
-- partition of old rows (one catalog change, a few WAL records) instead of
-- deleting its rows one by one (a WAL record per row and per index entry,
-- then vacuum).
--
-- The existing table, with its rows, indexes and settings, becomes the
-- first partition, ingest_task_transition_history, covering everything
-- before the start of tomorrow (UTC; later if a row is dated later): no row
-- is copied; under the lock the table is read twice (its newest row, then
-- the attach's check of the bound), which writers wait for. Daily
-- partitions follow, two days ahead of now (the leader keeps them ahead:
-- ingest_task_transition_extend), and a DEFAULT partition takes any row no
-- partition covers, so that no audit row, and so no state change, ever
-- fails for want of a partition; the next extension moves such rows into
-- the partition it creates for them.
--
-- A partitioned table's unique keys must include the partition key, so the
-- parent has none: each partition has its own primary key (task_id, id),
-- the index the documented query reads (per partition, in id order), and
-- its BRIN on created_at, as the table had. ids still come from the one
-- sequence ingest_task_transition_id_seq (owned by the parent's id).
--
-- Whatever triggers the table has are carried over to the parent, built
-- from the catalog (pg_get_triggerdef), with their enabled state: the
-- statement triggers with transition tables (ingest_task_done_notify,
-- ingest_task_release_dependents, ingest_task_pass_on_sequence, or what
-- replaced them) fire once per statement on the parent, their transition
-- table holding the rows of every partition the statement wrote. The
-- CHECK constraints come with the columns (CREATE TABLE ... LIKE) and keep
-- their names; the grants on the table are given on the parent.
-- +goose StatementBegin
CREATE FUNCTION ingest_task_transition_partitions()
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
COMMENT ON FUNCTION ingest_task_transition_partitions() IS
    'the partitions of ingest_task_transition with their bounds [lo, hi); the DEFAULT partition spans -infinity to infinity';

-- ingest_task_transition_extend creates the partitions from the upper
-- bound of the newest one, each width wide, until they reach now() +
-- ahead, and returns how many it created. Each new partition is built
-- alone (the settings of the newest partition, its primary key, its BRIN,
-- a CHECK of its bounds), takes the rows the DEFAULT partition holds for
-- its range, and is attached: ATTACH takes SHARE UPDATE EXCLUSIVE on the
-- parent, which writers of audit rows do not wait on.
-- +goose StatementBegin
CREATE FUNCTION ingest_task_transition_extend(width interval, ahead interval) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    lo timestamptz;
    hi timestamptz;
    newest text;
    opts text[];
    part text;
    n integer := 0;
BEGIN
    IF width IS NULL OR width <= interval '0' THEN
        RAISE EXCEPTION 'partition width must be positive, not %', width;
    END IF;
    SELECT p.name, p.hi INTO newest, hi FROM ingest_task_transition_partitions() p
    WHERE NOT p.is_default AND p.hi < 'infinity' ORDER BY p.hi DESC LIMIT 1;
    IF hi IS NULL THEN
        hi := date_trunc('day', now(), 'UTC');
    END IF;
    SELECT c.reloptions INTO opts FROM pg_class c
    WHERE c.oid = to_regclass(quote_ident(newest));
    WHILE hi < now() + ahead LOOP
        lo := hi;
        hi := lo + width;
        part := 'ingest_task_transition_p' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MISS');
        EXECUTE format('CREATE TABLE %I (LIKE ingest_task_transition INCLUDING CONSTRAINTS,
                            CONSTRAINT %I CHECK (created_at >= %L AND created_at < %L))',
                       part, part || '_bounds', lo, hi);
        IF opts IS NOT NULL THEN
            EXECUTE format('ALTER TABLE %I SET (%s)', part, array_to_string(opts, ', '));
        END IF;
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I PRIMARY KEY (task_id, id)', part, part || '_pkey');
        EXECUTE format('CREATE INDEX %I ON %I USING brin (created_at)', part || '_created_brin', part);
        IF to_regclass('ingest_task_transition_default') IS NOT NULL THEN
            EXECUTE format('WITH m AS (DELETE FROM ingest_task_transition_default WHERE created_at >= %L AND created_at < %L RETURNING *)
                            INSERT INTO %I SELECT * FROM m', lo, hi, part);
        END IF;
        EXECUTE format('ALTER TABLE ingest_task_transition ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', part, lo, hi);
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', part, part || '_bounds');
        n := n + 1;
    END LOOP;
    RETURN n;
END;
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION ingest_task_transition_extend(interval, interval) IS
    'creates the partitions of ingest_task_transition, each width wide, from the newest one''s end until now() + ahead; returns how many';

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
    cut timestamptz;
BEGIN
    LOCK TABLE ingest_task_transition IN ACCESS EXCLUSIVE MODE;
    FOR trig IN SELECT t.tgname, t.tgenabled, pg_get_triggerdef(t.oid) AS def FROM pg_trigger t
                WHERE t.tgrelid = 'ingest_task_transition'::regclass AND NOT t.tgisinternal ORDER BY t.tgname LOOP
        tnames := tnames || trig.tgname::text;
        tenabled := tenabled || trig.tgenabled::text;
        tdefs := tdefs || trig.def;
        EXECUTE format('DROP TRIGGER %I ON ingest_task_transition', trig.tgname);
    END LOOP;
    FOR g IN SELECT a.privilege_type, a.grantee, a.is_grantable FROM pg_class c
             CROSS JOIN LATERAL aclexplode(c.relacl) a
             WHERE c.oid = 'ingest_task_transition'::regclass AND a.grantee <> c.relowner LOOP
        grants := grants || format('GRANT %s ON ingest_task_transition TO %s%s', g.privilege_type,
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    cut := date_trunc('day', greatest(now(), (SELECT max(created_at) FROM ingest_task_transition)), 'UTC') + interval '1 day';

    ALTER TABLE ingest_task_transition RENAME TO ingest_task_transition_history;
    CREATE TABLE ingest_task_transition (LIKE ingest_task_transition_history INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
        PARTITION BY RANGE (created_at);
    ALTER SEQUENCE ingest_task_transition_id_seq OWNED BY ingest_task_transition.id;
    ALTER TABLE ingest_task_transition_history ALTER COLUMN id DROP DEFAULT;
    EXECUTE format('ALTER TABLE ingest_task_transition ATTACH PARTITION ingest_task_transition_history FOR VALUES FROM (MINVALUE) TO (%L)', cut);
    CREATE TABLE ingest_task_transition_default PARTITION OF ingest_task_transition DEFAULT;
    ALTER TABLE ingest_task_transition_default ADD CONSTRAINT ingest_task_transition_default_pkey PRIMARY KEY (task_id, id);
    CREATE INDEX ingest_task_transition_default_created_brin ON ingest_task_transition_default USING brin (created_at);
    SELECT array_to_string(c.reloptions, ', ') INTO s FROM pg_class c WHERE c.oid = 'ingest_task_transition_history'::regclass;
    IF s IS NOT NULL THEN
        EXECUTE format('ALTER TABLE ingest_task_transition_default SET (%s)', s);
    END IF;
    PERFORM ingest_task_transition_extend(interval '1 day', interval '2 days');

    FOREACH s IN ARRAY grants LOOP
        EXECUTE s;
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(tdefs, 1), 0) LOOP
        EXECUTE tdefs[i];
        IF tenabled[i] <> 'O' THEN
            EXECUTE format('ALTER TABLE ingest_task_transition %s TRIGGER %I',
                CASE tenabled[i] WHEN 'D' THEN 'DISABLE' WHEN 'R' THEN 'ENABLE REPLICA' ELSE 'ENABLE ALWAYS' END, tnames[i]);
        END IF;
    END LOOP;
END;
$$;
-- +goose StatementEnd
COMMENT ON TABLE ingest_task_transition IS
    'one audit row per task state change; partitioned by RANGE (created_at): retention drops whole partitions';

-- +goose Down
-- A plain table again, with the rows of the tasks that still exist (the
-- schema before this migration deletes a task's audit rows with it; rows
-- whose task retention deleted would stay forever), its primary key
-- (task_id, id), BRIN and settings, and the parent's triggers and grants.
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
    LOCK TABLE ingest_task_transition IN ACCESS EXCLUSIVE MODE;
    FOR trig IN SELECT t.tgname, t.tgenabled, pg_get_triggerdef(t.oid) AS def FROM pg_trigger t
                WHERE t.tgrelid = 'ingest_task_transition'::regclass AND NOT t.tgisinternal AND t.tgparentid = 0
                ORDER BY t.tgname LOOP
        tnames := tnames || trig.tgname::text;
        tenabled := tenabled || trig.tgenabled::text;
        tdefs := tdefs || trig.def;
    END LOOP;
    FOR g IN SELECT a.privilege_type, a.grantee, a.is_grantable FROM pg_class c
             CROSS JOIN LATERAL aclexplode(c.relacl) a
             WHERE c.oid = 'ingest_task_transition'::regclass AND a.grantee <> c.relowner LOOP
        grants := grants || format('GRANT %s ON ingest_task_transition TO %s%s', g.privilege_type,
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    SELECT c.reloptions INTO opts FROM ingest_task_transition_partitions() p
    JOIN pg_class c ON c.oid = to_regclass(quote_ident(p.name))
    WHERE NOT p.is_default ORDER BY p.hi DESC LIMIT 1;

    CREATE TABLE ingest_task_transition_plain (LIKE ingest_task_transition INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
    INSERT INTO ingest_task_transition_plain
    SELECT * FROM ingest_task_transition a WHERE EXISTS (SELECT 1 FROM ingest_task t WHERE t.id = a.task_id) ORDER BY a.id;
    ALTER SEQUENCE ingest_task_transition_id_seq OWNED BY ingest_task_transition_plain.id;
    DROP TABLE ingest_task_transition;
    ALTER TABLE ingest_task_transition_plain RENAME TO ingest_task_transition;
    ALTER TABLE ingest_task_transition ADD CONSTRAINT ingest_task_transition_pkey PRIMARY KEY (task_id, id);
    CREATE INDEX ingest_task_transition_created_brin ON ingest_task_transition USING brin (created_at);
    IF opts IS NOT NULL THEN
        EXECUTE format('ALTER TABLE ingest_task_transition SET (%s)', array_to_string(opts, ', '));
    END IF;
    FOREACH s IN ARRAY grants LOOP
        EXECUTE s;
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(tdefs, 1), 0) LOOP
        EXECUTE tdefs[i];
        IF tenabled[i] <> 'O' THEN
            EXECUTE format('ALTER TABLE ingest_task_transition %s TRIGGER %I',
                CASE tenabled[i] WHEN 'D' THEN 'DISABLE' WHEN 'R' THEN 'ENABLE REPLICA' ELSE 'ENABLE ALWAYS' END, tnames[i]);
        END IF;
    END LOOP;
END;
$$;
-- +goose StatementEnd
DROP FUNCTION ingest_task_transition_extend(interval, interval);
DROP FUNCTION ingest_task_transition_partitions();
