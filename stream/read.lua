-- Reads up to ARGV[3] new entries (">") for consumer ARGV[2] of group
-- ARGV[1] from the streams KEYS[1..n], serving them in that order: each
-- stream is read for as many entries as are still wanted, so an entry of
-- KEYS[i+1] is taken only when KEYS[i] had fewer new entries than wanted.
-- One round trip for every priority level of a task stream; non-blocking
-- (a script cannot block).
--
-- KEYS[i]   the streams, in the order to serve them (all in one slot)
-- ARGV[1]   consumer group
-- ARGV[2]   consumer
-- ARGV[3]   most entries to read, in all
--
-- Returns XREADGROUP's reply shape: {{stream, {{id, {field, value, ...}}, ...}}, ...},
-- only the streams that gave entries.
local want = tonumber(ARGV[3])
local out = {}
for _, key in ipairs(KEYS) do
    if want <= 0 then
        break
    end
    local res = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', want, 'STREAMS', key, '>')
    if res then
        local entries = res[1][2]
        if #entries > 0 then
            want = want - #entries
            out[#out + 1] = {key, entries}
        end
    end
end
return out
