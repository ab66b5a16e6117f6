-- +goose Up
-- outbox_event_extend decides again, before each partition's attach,
-- whether the ids being taken have come near it.
--
-- 00028 locked outbox_event (SHARE, parent only) before attaching a
-- partition that would begin within a guard of the last id taken, a
-- minute's ids at the rate of the last width (at least min_ids). It
-- decided once, at the start, from the last id then; the partition was
-- attached, and the attach committed, after its indexes were built and
-- the rest of the pass ran. On a table younger than 10 s no rate is read
-- and the guard was min_ids: inserts taking ids faster than min_ids in
-- that time (three writers of 40-row batches took 2,000 ids in a few
-- hundred ms on a loaded machine) reached the new partition's range
-- before the attach committed, and an insert that had routed its rows by
-- the partitions from before failed on the DEFAULT partition's shrunk
-- bounds ("new row for relation outbox_event_default violates partition
-- constraint"), as before 00028.
--
-- Now:
--   - the guard of a table younger than 10 s counts a minute of ids at
--     the rate its rows show (their ids over their age, at least a second);
--   - before each attach, after the partition's indexes are built, the
--     last id is read again, and when it is within the guard of the
--     partition's start the table is locked then; the rows the DEFAULT
--     partition holds in the partition's range (ids written past the
--     sequence, or taken past its start before the lock) are moved into
--     it under the lock, and it is attached.
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

-- +goose Down
-- The extension of 00028.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_event_extend(width interval, ahead interval, min_ids bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    last bigint := outbox_event_last_id();
    since_id bigint;
    since_at timestamptz;
    rate float8 := 0;
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
    END IF;
    size := greatest(min_ids, ceil(rate * extract(epoch FROM width))::bigint);
    reach := greatest(min_ids, ceil(rate * extract(epoch FROM ahead))::bigint);
    guard := least(reach, greatest(min_ids, ceil(rate * 60)::bigint));
    goal := last + reach;
    SELECT p.name, p.hi INTO newest, hi FROM outbox_event_partitions() p
    WHERE NOT p.is_default AND p.hi IS NOT NULL ORDER BY p.hi DESC LIMIT 1;
    IF hi IS NULL OR hi <= last THEN
        hi := last + 1;
    END IF;
    IF hi < last + guard THEN
        LOCK TABLE ONLY outbox_event IN SHARE MODE;
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
        -- Rows written with ids of their own past the sequence.
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
    'creates the partitions of outbox_event, each the ids width of time takes, from the newest one''s end (or the last id taken, under SHARE on the table when ids are within a minute of it) until they reach the ids ahead of time takes; returns how many';
