-- Dead-letters one task-stream entry: XADD to the DLQ and XACK the source
-- entry, atomically. If the XADD fails, the script stops before the XACK and
-- the source entry stays pending. Nothing is written when the source entry
-- is not pending (already acknowledged), so a repeated call is harmless.
--
-- With a marker key, a death is dead-lettered at most once: when the marker
-- exists (another entry of the same task already carried this death to the
-- DLQ) the source entry is only acknowledged. The marker is set after the
-- XADD succeeded, never before, so a failed XADD leaves no marker behind.
--
-- KEYS[1]   task stream
-- KEYS[2]   DLQ stream
-- KEYS[3]   (optional) marker of this death: task id and time of death
-- ARGV[1]   consumer group of KEYS[1]
-- ARGV[2]   source entry id (in KEYS[1])
-- ARGV[3]   marker lifetime in ms (used with KEYS[3])
-- ARGV[4..] DLQ entry fields and values, alternating
--
-- Returns the new DLQ entry id, or false (nil) when nothing was written.
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending == 0 then
    return false
end
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
    return false
end
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 4))
if KEYS[3] then
    redis.call('SET', KEYS[3], id, 'PX', ARGV[3])
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return id
