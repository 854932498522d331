-- Units of the product went back on sale: bump its generation, lower its sold-out flag and
-- announce it.
--
-- A sweep reads `gen` before it visits the buckets and raises the flag only if `gen` has not
-- moved (sold_out.lua), so a sweep that raced with the returned unit cannot
-- leave the flag up over it. Whoever remembers the flag outside Redis (a replica's local
-- flag, the gateway answering sold-out purchases itself) hears the new `gen` on the channel
-- and forgets it; an answer computed under an older `gen` is then known to be stale.
-- KEYS[1] product state hash {gen, sold_out, loaded}
-- ARGV[1] the reopened channel ('' publishes nothing), ARGV[2] the product id
-- Returns the new gen. A state hash that did not exist gets a day's lifetime (extend.lua and
-- sold_out.lua extend it to the sale's own when the stock loads or the flag goes up).
local existed = redis.call('EXISTS', KEYS[1])
local gen = redis.call('HINCRBY', KEYS[1], 'gen', 1)
redis.call('HDEL', KEYS[1], 'sold_out')
if existed == 0 then
  redis.call('PEXPIRE', KEYS[1], 86400000)
end
if ARGV[1] and ARGV[1] ~= '' then
  redis.call('PUBLISH', ARGV[1], ARGV[2] .. ' ' .. gen)
end
return gen
