-- Compare-and-set of an idempotency record: only the request that wrote `expected` may
-- replace it (its lease may have passed, and another request taken the key over).
-- KEYS[1] the record
-- ARGV[1] the record as this request wrote it, ARGV[2] the new record, ARGV[3] its TTL ms
-- Returns: 1 replaced, 0 the record is no longer this request's (or is gone).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
