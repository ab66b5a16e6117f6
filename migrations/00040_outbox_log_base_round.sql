-- +goose Up
-- The outbox log's position when its rounds are gone. Until now
-- outbox_log_position had no row when outbox_log_round was empty (a
-- TRUNCATE of the log's tables, as a benchmark or an operator empties
-- them): outbox_log_take then read NULLs, never started a round, and the
-- log's rows stayed unpublished, their tasks QUEUED, with nothing to say
-- so (outbox_log_unsent was empty too).
--
-- Now the round before the first is a snapshot that sees no transaction
-- ('1:1:'). When no round exists the position is that base round, with
-- the number of the newest batch left behind (so the round the take
-- starts after it has no batch, and no old cursor) and nothing left to
-- take; the next take finds rows past its xmax, starts a round from a
-- fresh snapshot and publishes every committed row of the log, in commit
-- order. Rows published before the rounds were emptied are published
-- again (at least once). A round with no round before it has the base
-- snapshot as its prev too, not its own: a round's range starts at
-- prev's xmax, so a round started by a take with no round before it
-- would have taken its first batch and nothing after. (The migration's
-- round 0 takes nothing either way: the log was created with it.)
CREATE OR REPLACE VIEW outbox_log_position AS
SELECT r.round, coalesce(pr.snap, '1:1:'::pg_snapshot) AS prev, r.snap AS cur,
       coalesce(b.last_txid, '0'::xid8) AS txid, coalesce(b.last_id, 0) AS id
FROM (
    (SELECT x.round, x.snap FROM outbox_log_round x ORDER BY x.round DESC LIMIT 1)
    UNION ALL
    SELECT coalesce((SELECT max(ob.round) FROM outbox_log_batch ob), -1), '1:1:'::pg_snapshot
    WHERE NOT EXISTS (SELECT 1 FROM outbox_log_round)
) r
LEFT JOIN LATERAL (SELECT p.snap FROM outbox_log_round p WHERE p.round < r.round ORDER BY p.round DESC LIMIT 1) pr ON true
LEFT JOIN LATERAL (SELECT b.last_txid, b.last_id FROM outbox_log_batch b WHERE b.round = r.round
                   ORDER BY b.last_txid DESC, b.last_id DESC LIMIT 1) b ON true;

-- +goose Down
-- The view of 00039 needs a round: a base round as above if none is left.
INSERT INTO outbox_log_round
SELECT coalesce((SELECT max(b.round) FROM outbox_log_batch b), -1), '1:1:'::pg_snapshot, '1'::xid8
WHERE NOT EXISTS (SELECT 1 FROM outbox_log_round);
CREATE OR REPLACE VIEW outbox_log_position AS
SELECT r.round, coalesce(pr.snap, r.snap) AS prev, r.snap AS cur,
       coalesce(b.last_txid, '0'::xid8) AS txid, coalesce(b.last_id, 0) AS id
FROM (SELECT * FROM outbox_log_round ORDER BY round DESC LIMIT 1) r
LEFT JOIN LATERAL (SELECT p.snap FROM outbox_log_round p WHERE p.round < r.round ORDER BY p.round DESC LIMIT 1) pr ON true
LEFT JOIN LATERAL (SELECT b.last_txid, b.last_id FROM outbox_log_batch b WHERE b.round = r.round
                   ORDER BY b.last_txid DESC, b.last_id DESC LIMIT 1) b ON true;
