-- Make a key live at least until a given time: its expiry only ever moves later.
--
-- The product's state hash (`gen`, `sold_out`, `loaded`) must live as long as its buckets: an
-- expired `gen` restarts from nothing, and a sweep that read an old value could see it again
-- and raise the sold-out flag over a unit that went back on sale.
-- KEYS[1] the key
-- ARGV[1] unix ms it must live until
-- Returns: 1 extended, 0 it already lived long enough (or does not exist).
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then
  return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if ttl == -1 or now + ttl < tonumber(ARGV[1]) then
  redis.call('PEXPIREAT', KEYS[1], ARGV[1])
  return 1
end
return 0
