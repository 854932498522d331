-- Put a given-up purchase's unit back on sale in the buyer's home bucket, once per event.
--
-- All keys share the home bucket's hash tag (one Redis Cluster slot).
-- KEYS[1] stock hash of the home bucket {remaining, ..., expire_at}
-- KEYS[2] buyers hash (user id -> purchase marker)
-- KEYS[3] results hash (user id -> buyer-visible result)
-- KEYS[4] returned set (event ids whose unit this bucket already took back)
-- ARGV[1] user id, ARGV[2] event id (the purchase's request id), ARGV[3] result text,
-- ARGV[4] '1' to put the unit back, '0' to release the buyer only (the unit never existed in
-- the database: it was refused for want of stock)
-- Returns: 1 returned now, 2 recorded but the bucket is not loaded (a later load counts the
-- unit from Postgres), 3 buyer released without a unit, 0 this event was already compensated.
if redis.call('SADD', KEYS[4], ARGV[2]) == 0 then
  return 0
end
local outcome = 2
local expire_at = redis.call('HGET', KEYS[1], 'expire_at')
if expire_at then
  if ARGV[4] == '1' then
    redis.call('HINCRBY', KEYS[1], 'remaining', 1)
    outcome = 1
  else
    outcome = 3
  end
  redis.call('PEXPIREAT', KEYS[4], expire_at)
else
  -- Nothing loaded to keep the set's lifetime from: an hour is far beyond any retry.
  redis.call('PEXPIRE', KEYS[4], 3600000)
end
-- The buyer may buy again. Only this purchase's marker is cleared ('h:<id>' bought in the
-- home bucket, 't<n>:<id>' swept from bucket n, 'o' loaded from an order in Postgres): if
-- the buyer has bought again since, that newer purchase stands. A reservation 'r:<ms>' is
-- this purchase's too: a sweep took its unit but never settled the marker (the settle's
-- answer was lost). No newer purchase can hold it: one could only have reserved after this
-- purchase's marker was cleared, which is this script's job, once per event.
local marker = redis.call('HGET', KEYS[2], ARGV[1])
local ours = marker == 'o'
  or (marker and string.sub(marker, 1, 2) == 'r:')
  or (marker and string.sub(marker, -(#ARGV[2] + 1)) == ':' .. ARGV[2])
if ours then
  redis.call('HDEL', KEYS[2], ARGV[1])
end
if ours or not marker then
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
end
return outcome
