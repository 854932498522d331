-- Load a product's stock into Redis, unless it is already there.
--
-- Guarded by "does the stock hash exist" inside the script, so two loaders racing (a lock
-- that expired under a slow loader) can never overwrite stock that is already selling.
-- KEYS[1] stock hash
-- KEYS[2] buyers set
-- ARGV[1] remaining units, ARGV[2] total units, ARGV[3] start ms, ARGV[4] end ms
-- ARGV[5..] user ids that already hold an order
-- Returns: 1 loaded, 0 was already loaded.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
for i = 5, #ARGV, 500 do
  redis.call('SADD', KEYS[2], unpack(ARGV, i, math.min(i + 499, #ARGV)))
end
redis.call('HSET', KEYS[1], 'remaining', ARGV[1], 'total', ARGV[2],
  'start_ms', ARGV[3], 'end_ms', ARGV[4])
return 1
