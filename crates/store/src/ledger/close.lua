-- Close a sweep's reservation in the buyer's home bucket: turn it into the marker of the unit
-- the sweep took from another bucket, or drop it when the sweep found nothing.
--
-- KEYS[1] buyers hash of the home bucket
-- KEYS[2] results hash of the home bucket
-- ARGV[1] user id
-- ARGV[2] the reservation marker expected (r:<ms>:<request id>); anything else is not ours
-- ARGV[3] the new marker (t<bucket>:<request id>), or '' to drop the reservation
-- ARGV[4] the buyer's result to show (queued:<request id>), or '' for none. It never
--         overwrites a success: order-service may have been faster than this step.
-- Returns: 1 closed, 0 the reservation was not (or no longer) there.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
if ARGV[4] ~= '' then
  local current = redis.call('HGET', KEYS[2], ARGV[1])
  if not current or string.sub(current, 1, 8) ~= 'success:' then
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
  end
end
return 1
