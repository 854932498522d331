-- Load one bucket of a product's stock into Redis from a Postgres snapshot, unless it is
-- already there.
--
-- Guarded by "does the stock hash exist" inside the script, so two loaders racing (a lock
-- that expired under a slow loader) can never overwrite a bucket that is already selling.
-- The bucket's units are its share of the total less the purchases that took a unit from it,
-- as of the snapshot (ledger version ARGV[5]); given-up purchases recorded in the returns
-- hash with a newer version were not visible to that snapshot, so their units are added here,
-- and those whose buyer the released hash says was released get no marker back (see
-- seckill_store::ledger).
-- KEYS[1] stock hash of the bucket
-- KEYS[2] buyers hash of the bucket (markers of the users homed here)
-- KEYS[3] results hash of the bucket
-- KEYS[4] returns hash of the bucket (event id -> ledger version of its give-up)
-- KEYS[5] released hash of the bucket (request ids of given-up purchases whose buyer was
--         released: the snapshot may predate the give-up, so they get no marker or result)
-- ARGV[1] units for this bucket as of the snapshot, ARGV[2] start ms, ARGV[3] end ms
-- ARGV[4] unix ms at which the bucket's keys expire (after the sale, randomised per bucket)
-- ARGV[5] the snapshot's ledger version
-- ARGV[6..] triples (user id, request id, result) of the purchases held for users homed in
--           this bucket: each gets the marker o:<request id> and that result, unless a marker
--           (or result) is already there or the purchase is in the released hash
-- Returns: 1 loaded, 0 was already loaded.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local units = tonumber(ARGV[1])
local returns = redis.call('HGETALL', KEYS[4])
for i = 1, #returns, 2 do
  if tonumber(returns[i + 1]) > tonumber(ARGV[5]) then
    units = units + 1
  end
end
for i = 6, #ARGV, 3 do
  if redis.call('HEXISTS', KEYS[5], ARGV[i + 1]) == 0 then
    redis.call('HSETNX', KEYS[2], ARGV[i], 'o:' .. ARGV[i + 1])
    redis.call('HSETNX', KEYS[3], ARGV[i], ARGV[i + 2])
  end
end
redis.call('HSET', KEYS[1], 'remaining', units, 'loaded_units', units, 'v', ARGV[5],
  'start_ms', ARGV[2], 'end_ms', ARGV[3], 'expire_at', ARGV[4])
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('PEXPIREAT', KEYS[i], ARGV[4])
  end
end
return 1
