-- +goose Up
-- A partition is never attached over ids or times that rows are being
-- written with (packages outbox and transition, partitions.go).
--
-- ATTACH PARTITION takes SHARE UPDATE EXCLUSIVE on the table, which
-- writers do not wait for; a statement that began routing its rows before
-- the attach committed routes them by the partitions it saw then. A row of
-- such a statement that the new partition covers is sent to the DEFAULT
-- partition, whose bounds have meanwhile shrunk, and the statement fails
-- ("new row for relation ... violates partition constraint"). Until now
-- the extension opened the next partition from the newest one's end even
-- when ids, or the clock, had already passed it: on a new database at more
-- than 10,000 outbox rows in its first minute, the first ones overran the
-- partitions opened for 10,000 ids, and the leader's next extension then
-- attached the range the inserts were writing into, failing some of them.
--
-- Now the extensions do not attach over rows being written:
--   - outbox_event_extend: when the first new partition would begin within
--     a guard of the last id taken (the ids a minute takes at the rate of
--     the last width, at least min_ids; the rate is now read once the
--     oldest row of the last width is 10 s old, not a minute), it first
--     takes SHARE on outbox_event (ONLY the parent, which every writer of
--     outbox rows locks): it waits for the transactions writing outbox
--     rows to end and holds new ones back until it commits, so none routes
--     a row by the partitions from before (the wait is bounded by the
--     caller's lock_timeout; a timeout fails the extension, to be retried
--     at the next pass). Under that lock the first new partition begins
--     just past the last id taken, and the ids between the newest
--     partition's end and it stay in the DEFAULT partition (with the rows
--     Retire keeps; the sweep deletes those of deleted tasks): on a new
--     database, the rows of its first minute or two. From then on the
--     partitions reach two days ahead, each new one begins far past the
--     ids being taken, and no lock is taken.
--   - ingest_task_transition_extend: the first new partition begins no
--     earlier than a minute past now() (an audit row is dated by its
--     transaction's now(), so no open transaction can write past it), and
--     the rows between the newest partition's end and it stay in the
--     DEFAULT partition.
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_task_transition_extend(width interval, ahead interval) RETURNS integer
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
    IF hi IS NULL OR hi < now() + interval '1 minute' THEN
        hi := now() + interval '1 minute';
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
        -- Rows written with times of their own past now().
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
    'creates the partitions of ingest_task_transition, each width wide, from the newest one''s end (no earlier than a minute past now()) until now() + ahead; returns how many';

-- +goose Down
-- The extensions of 00027 (outbox) and 00024 (audit).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_event_extend(width interval, ahead interval, min_ids bigint) RETURNS integer
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_task_transition_extend(width interval, ahead interval) RETURNS integer
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
