-- Put a given-up purchase's unit back into the bucket it was taken from, once per event, and
-- only if the bucket's load did not already count it.
--
-- A load writes the ledger version it read from Postgres into the bucket (`v`); a give-up
-- carries the version its transaction committed as. Versions follow commit order, so a
-- give-up numbered at most `v` was visible to the load, which counted its unit as unsold.
-- When the bucket is not loaded, the event and its version wait in the returns hash, and
-- load.lua adds the units its own snapshot could not see.
-- All keys share the bucket's hash tag (one Redis Cluster slot).
-- KEYS[1] stock hash of the bucket {remaining, v, expire_at, ...}
-- KEYS[2] returns hash (event id -> ledger version of its give-up)
-- ARGV[1] event id (the purchase's request id), ARGV[2] ledger version of the give-up
-- ARGV[3] ms the returns hash lives when the bucket is not loaded (nothing to inherit from)
-- Returns: 1 put back now, 2 recorded for the next load (bucket not loaded), 3 the bucket's
-- load already counted it, 0 this event was already handled.
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  return 0
end
local stock = redis.call('HMGET', KEYS[1], 'v', 'expire_at')
if not stock[2] then
  if redis.call('PTTL', KEYS[2]) == -1 then
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
  end
  return 2
end
redis.call('PEXPIREAT', KEYS[2], stock[2])
if tonumber(ARGV[2]) > tonumber(stock[1] or '-1') then
  redis.call('HINCRBY', KEYS[1], 'remaining', 1)
  return 1
end
return 3
