-- Units of the product went back on sale: bump its generation and lower its sold-out flag.
--
-- A sweep reads `gen` before it visits the buckets and raises the flag only if `gen` has not
-- moved (sold_out.lua), so a sweep that raced with the returned unit cannot
-- leave the flag up over it.
-- KEYS[1] product state hash {gen, sold_out, loaded}
-- Returns 1. A state hash that did not exist gets a day's lifetime (extend.lua and
-- sold_out.lua extend it to the sale's own when the stock loads or the flag goes up).
local existed = redis.call('EXISTS', KEYS[1])
redis.call('HINCRBY', KEYS[1], 'gen', 1)
redis.call('HDEL', KEYS[1], 'sold_out')
if existed == 0 then
  redis.call('PEXPIRE', KEYS[1], 86400000)
end
return 1
