-- Release a given-up purchase's buyer in their home bucket: clear the purchase's marker so
-- they may buy again, show them why it failed, and remember that it was released.
--
-- Only this purchase's own marker is cleared: every marker ends with `:<request id>`
-- (see seckill_store::ledger). A newer purchase of the same buyer stands, and so does its
-- result. Safe to run again: a second run finds no marker of this purchase.
-- The purchase is recorded in the released hash whatever else happens: a load whose
-- snapshot was read before the give-up committed still holds it, and load.lua (same slot)
-- writes no marker for a purchase recorded there. Either this runs first and the load skips
-- the marker, or the load does and this clears it.
--
-- A buyer may still hold a live order of the product from another purchase (this one was a
-- second purchase Redis let through after losing their marker): then this purchase's marker
-- gives way to that order's (the marker a load would write), so the buyer cannot be accepted
-- a third time, and its result to that order's success, so the buyer keeps seeing the order
-- they hold.
-- KEYS[1] buyers hash of the home bucket (user id -> marker)
-- KEYS[2] results hash of the home bucket (user id -> buyer-visible result)
-- KEYS[3] stock hash of the home bucket (its expire_at, when it is loaded)
-- KEYS[4] released hash of the home bucket (request id -> 1)
-- ARGV[1] user id, ARGV[2] event id (the purchase's request id), ARGV[3] result text,
-- ARGV[4] the purchase's order id, '' if it never became an order
-- ARGV[5] ms the released hash lives at least when the bucket is not loaded
-- ARGV[6] the marker of the buyer's live order of the product ('o:<its request id>'), '' if
--         they hold none; ARGV[7] that order's result text ('success:<order id>')
-- Returns: 1 marker cleared, 2 no marker but the result was this purchase's (or none): the
-- result set, 3 marker and result handed to the buyer's live order, 0 another purchase of
-- this buyer stands: nothing changed but the released hash.
redis.call('HSET', KEYS[4], ARGV[2], '1')
local expire_at = redis.call('HGET', KEYS[3], 'expire_at')
if expire_at then
  redis.call('PEXPIREAT', KEYS[4], expire_at)
elseif redis.call('PTTL', KEYS[4]) < tonumber(ARGV[5]) then
  redis.call('PEXPIRE', KEYS[4], ARGV[5])
end
local suffix = ':' .. ARGV[2]
local standing = ARGV[6] and ARGV[6] ~= ''
local marker = redis.call('HGET', KEYS[1], ARGV[1])
if marker then
  if string.sub(marker, -#suffix) ~= suffix then
    return 0
  end
  if standing then
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[6])
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[7])
    return 3
  end
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  return 1
end
local current = redis.call('HGET', KEYS[2], ARGV[1])
if current and current ~= 'queued' .. suffix
    and (ARGV[4] == '' or current ~= 'success:' .. ARGV[4]) then
  return 0
end
-- No marker to hand over (and none is written into a hash that may have no expiry).
redis.call('HSET', KEYS[2], ARGV[1], standing and ARGV[7] or ARGV[3])
return 2
