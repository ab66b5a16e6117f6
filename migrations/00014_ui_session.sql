-- +goose Up
-- The dashboard's sessions (package ui, session.go). A login inserts a row,
-- a logout deletes it, and a session cookie is accepted only while its row
-- exists and has not expired: a logout ends the session on every process
-- that serves the dashboard, and a copied cookie stops working with it.
-- id_hash is the SHA-256 of the random id the cookie carries, so the table
-- alone logs nobody in. Expired rows are deleted by the next login.
CREATE TABLE ingest_ui_session (
    id_hash    bytea PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE ingest_ui_session;
