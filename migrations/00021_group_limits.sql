-- +goose Up
-- Per-group (tenant) limits (package task, group.go). A task may carry a
-- group_key (a tenant, a customer, a source); NULL: no group, which counts
-- as one group of its own. A kind's concurrency_per_group and
-- rate_per_group_count per rate_per_group_period_ms hold for each group of
-- the kind as the kind's own concurrency and rate hold for the kind, across
-- all processes, and combine with them: a start needs room under both.
ALTER TABLE ingest_task ADD COLUMN group_key text;
COMMENT ON COLUMN ingest_task.group_key IS 'the task''s group (a tenant): per-group limits and fair release; NULL: no group';

ALTER TABLE ingest_kind
    ADD COLUMN concurrency_per_group    integer NOT NULL DEFAULT 0 CHECK (concurrency_per_group >= 0),
    ADD COLUMN rate_per_group_count     integer NOT NULL DEFAULT 0 CHECK (rate_per_group_count >= 0),
    ADD COLUMN rate_per_group_period_ms integer NOT NULL DEFAULT 1000 CHECK (rate_per_group_period_ms > 0),
    -- Fair scheduling: at most this many tasks of one group of the kind
    -- are in the stream or running at once; a group's tasks beyond it are
    -- created parked and released round-robin across the groups as room
    -- frees (0: the default, task.DefaultGroupWindow).
    ADD COLUMN group_window             integer NOT NULL DEFAULT 0 CHECK (group_window >= 0);

-- The settings after each change (NULL: not changed by it).
ALTER TABLE ingest_kind_change
    ADD COLUMN concurrency_per_group integer,
    ADD COLUMN rate_per_group        text,
    ADD COLUMN group_window          integer;

-- The slots of a group of a kind with concurrency_per_group: as
-- ingest_kind_slot, per (kind, group). group_key '' is the tasks without
-- a group.
CREATE TABLE ingest_group_slot (
    kind        text NOT NULL,
    group_key   text NOT NULL,
    task_id     uuid NOT NULL,
    reserved_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, group_key, task_id)
);

-- The starts of a group of a kind with rate_per_group in the last period
-- (and a margin), as ingest_kind.rate_log and rate_log_n hold the kind's.
CREATE TABLE ingest_group_rate (
    kind       text NOT NULL,
    group_key  text NOT NULL,
    rate_log   timestamptz[] NOT NULL DEFAULT '{}',
    rate_log_n integer[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (kind, group_key)
);

-- The parked tasks of a group, in creation order: the release of a kind
-- with per-group limits serves its groups round-robin, skipping those at
-- their limit. Only parked rows with a group are indexed (the statements
-- that name no group keep to ingest_task_parked_idx), and the predicate
-- names parked_at, which a start does not change (a start stays HOT,
-- docs/ARCHITECTURE.md §3.5), and group_key, which never changes.
CREATE INDEX ingest_task_parked_group_idx ON ingest_task (kind, group_key, id)
    WHERE parked_at IS NOT NULL AND group_key IS NOT NULL;

-- The parked tasks without a group, for the same release: whether a kind
-- has any is one probe, not a scan of its parked tasks with a group.
CREATE INDEX ingest_task_parked_nogroup_idx ON ingest_task (kind, id)
    WHERE parked_at IS NOT NULL AND group_key IS NULL;

-- A group's tasks in the stream or running (unfinished, not parked),
-- which its window bounds: counted when a task of the group is created
-- and when the group's parked tasks are released. Tasks without a group
-- are not indexed, and the predicate names no column a start changes.
CREATE INDEX ingest_task_group_live_idx ON ingest_task (kind, group_key)
    WHERE group_key IS NOT NULL AND finished_at IS NULL AND parked_at IS NULL;

-- +goose Down
DROP INDEX ingest_task_group_live_idx;
DROP INDEX ingest_task_parked_nogroup_idx;
DROP INDEX ingest_task_parked_group_idx;
DROP TABLE ingest_group_rate;
DROP TABLE ingest_group_slot;
ALTER TABLE ingest_kind_change
    DROP COLUMN group_window,
    DROP COLUMN rate_per_group,
    DROP COLUMN concurrency_per_group;
ALTER TABLE ingest_kind
    DROP COLUMN group_window,
    DROP COLUMN rate_per_group_period_ms,
    DROP COLUMN rate_per_group_count,
    DROP COLUMN concurrency_per_group;
ALTER TABLE ingest_task DROP COLUMN group_key;
