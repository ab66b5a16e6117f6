-- Dead-letters one task-stream entry: XADD to the DLQ and XACK the source
-- entry, atomically. If the XADD fails, the script stops before the XACK and
-- the source entry stays pending. Nothing is written when the source entry
-- is not pending (already acknowledged), so a repeated call is harmless.
--
-- KEYS[1]   task stream
-- KEYS[2]   DLQ stream
-- ARGV[1]   consumer group of KEYS[1]
-- ARGV[2]   source entry id (in KEYS[1])
-- ARGV[3..] DLQ entry fields and values, alternating
--
-- Returns the new DLQ entry id, or false (nil) when the source entry was not
-- pending.
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending == 0 then
    return false
end
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return id
