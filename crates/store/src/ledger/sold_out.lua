-- Raise the product's sold-out flag, unless units went back on sale since the sweep began.
--
-- A sweep reads `gen` before visiting the buckets; whatever puts a unit back bumps `gen`
-- after doing so (and clears the flag). Comparing here means a sweep that raced with a
-- returned unit can never leave the flag up over stock that is on sale again.
-- KEYS[1] product state hash {gen, sold_out}
-- ARGV[1] gen read before the sweep ('' when it was unset)
-- ARGV[2] unix ms at which the flag expires with the rest of the sale's keys
-- Returns: 1 raised, 0 stale (gen moved).
local gen = redis.call('HGET', KEYS[1], 'gen') or ''
if gen ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'sold_out', '1')
-- Only ever later: a replica whose copy of the product predates a window extension must not
-- shorten the state's life below its buckets' (an expired `gen` restarts from nothing, and a
-- sweep holding an old value could match it again).
local ttl = redis.call('PTTL', KEYS[1])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if ttl < 0 or now + ttl < tonumber(ARGV[2]) then
  redis.call('PEXPIREAT', KEYS[1], ARGV[2])
end
return 1
