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

-- +goose Down
DROP INDEX ingest_task_workflow_idx;
DROP TABLE ingest_task_dependency;
ALTER TABLE ingest_task
    DROP COLUMN dependency_depth,
    DROP COLUMN workflow_id,
    DROP COLUMN on_dependency_failure,
    DROP COLUMN waiting_for;
