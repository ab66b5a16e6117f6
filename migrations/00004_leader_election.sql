-- +goose Up
-- One row per leader election (package maintenance): the process named
-- leader_id runs the singleton services until expires_at, unless it renews
-- the lease first. A follower takes the row over only once it has
-- expired; a leader that stops gracefully deletes it. Expiry is database
-- time (now()), so no two machines' clocks are compared.
CREATE TABLE ingest_leader (
    name       text PRIMARY KEY,
    leader_id  text NOT NULL,
    elected_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE ingest_leader;
