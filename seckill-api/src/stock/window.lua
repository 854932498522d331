-- Apply a changed sale window to one loaded bucket (the product was edited).
--
-- KEYS[1] stock hash, KEYS[2] buyers hash, KEYS[3] takers hash, KEYS[4] results hash
-- ARGV[1] start ms, ARGV[2] end ms, ARGV[3] unix ms at which the bucket's keys expire
-- Returns: 1 updated, 0 the bucket is not loaded (it will load with the new window).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'start_ms', ARGV[1], 'end_ms', ARGV[2], 'expire_at', ARGV[3])
for _, key in ipairs(KEYS) do
  redis.call('PEXPIREAT', key, ARGV[3])
end
return 1
