-- Load one bucket of a product's stock into Redis, unless it is already there.
--
-- Guarded by "does the stock hash exist" inside the script, so two loaders racing (a lock
-- that expired under a slow loader) can never overwrite a bucket that is already selling.
-- KEYS[1] stock hash of the bucket
-- KEYS[2] buyers hash of the bucket
-- ARGV[1] units for this bucket, ARGV[2] start ms, ARGV[3] end ms
-- ARGV[4] unix ms at which the bucket's keys expire (after the sale, randomised per bucket)
-- ARGV[5..] ids of users homed in this bucket who already hold an order
-- Returns: 1 loaded, 0 was already loaded.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
for i = 5, #ARGV, 500 do
  local fields = {}
  for j = i, math.min(i + 499, #ARGV) do
    fields[#fields + 1] = ARGV[j]
    fields[#fields + 1] = 'o'
  end
  redis.call('HSET', KEYS[2], unpack(fields))
end
redis.call('HSET', KEYS[1], 'remaining', ARGV[1], 'share', ARGV[1],
  'start_ms', ARGV[2], 'end_ms', ARGV[3], 'expire_at', ARGV[4])
redis.call('PEXPIREAT', KEYS[1], ARGV[4])
if #ARGV >= 5 then
  redis.call('PEXPIREAT', KEYS[2], ARGV[4])
end
return 1
