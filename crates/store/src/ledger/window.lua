-- Apply a changed sale window to one loaded bucket (the product was edited).
--
-- The keys' expiry only ever moves later. A bucket that expires is loaded again from
-- Postgres, which cannot count the purchases still on their way there (outbox, broker,
-- retries): expiring it early (a sale closed with an end long past, then reopened) would
-- sell their units again and let their buyers buy twice.
-- KEYS[1] stock hash, KEYS[2] buyers hash, KEYS[3] takers hash, KEYS[4] results hash,
-- KEYS[5] returns hash (given-up event ids -> ledger version), KEYS[6] released hash
-- (given-up request ids whose buyer was released)
-- ARGV[1] start ms, ARGV[2] end ms, ARGV[3] unix ms at which the bucket's keys expire
-- Returns: 1 updated, 0 the bucket is not loaded (it will load with the new window).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local expire_at = tonumber(ARGV[3])
local current = tonumber(redis.call('HGET', KEYS[1], 'expire_at'))
if current and current > expire_at then
  expire_at = current
end
redis.call('HSET', KEYS[1], 'start_ms', ARGV[1], 'end_ms', ARGV[2], 'expire_at', expire_at)
for _, key in ipairs(KEYS) do
  redis.call('PEXPIREAT', key, expire_at)
end
return 1
