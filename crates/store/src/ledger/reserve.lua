-- Reserve the buyer's purchase in their home bucket before sweeping the other buckets.
--
-- The marker `r:<now>:<request id>` keeps "one unit per user" while the unit is taken from another
-- bucket (in another slot, so not in this script). take.lua refuses a reservation older than
-- the fence, so once a reservation is older than fence + clock-skew margin, no sweep can
-- still take a unit for it and it can be resolved safely (see seckill_store::ledger).
-- KEYS[1] buyers hash of the home bucket
-- KEYS[2] stock hash of the home bucket (for its expire_at)
-- ARGV[1] user id, ARGV[2] request id
-- Returns the reservation time (ms, Redis clock), or -1 if the user already has a marker.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return -1
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], 'r:' .. now .. ':' .. ARGV[2])
if redis.call('PTTL', KEYS[1]) == -1 then
  local expire_at = redis.call('HGET', KEYS[2], 'expire_at')
  if expire_at then
    redis.call('PEXPIREAT', KEYS[1], expire_at)
  end
end
return now
