-- Removes the consumers of a group that are idle and have nothing pending,
-- atomically: nothing can become pending between the check and the removal
-- (XGROUP DELCONSUMER drops a consumer's pending entries, so removing one
-- that has any would lose them).
--
-- KEYS[1]: the stream
-- ARGV[1]: the consumer group
-- ARGV[2]: the caller's own consumer name (never removed)
-- ARGV[3]: idle threshold in ms: only consumers idle at least this long go
-- ARGV[4]: the most consumers to remove in one call
--
-- Returns a flat array: name, dropped, name, dropped, ... for each consumer
-- removed, where dropped is DELCONSUMER's reply (the pending entries it
-- dropped; 0 by construction).
local consumers = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
local self = ARGV[2]
local min_idle = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local out = {}
local removed = 0
for _, c in ipairs(consumers) do
    local name, pending, idle
    for i = 1, #c, 2 do
        local k = c[i]
        if k == 'name' then
            name = c[i + 1]
        elseif k == 'pending' then
            pending = c[i + 1]
        elseif k == 'idle' then
            idle = c[i + 1]
        end
    end
    -- An unknown idle (nil, or -1 on some servers) is never taken as idle.
    if name ~= nil and name ~= self and pending == 0 and idle ~= nil and idle >= min_idle then
        local dropped = redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
        out[#out + 1] = name
        out[#out + 1] = dropped
        removed = removed + 1
        if removed >= limit then
            break
        end
    end
end
return out
