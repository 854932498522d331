-- Release a given-up purchase's buyer in their home bucket: clear the purchase's marker so
-- they may buy again, and show them why it failed.
--
-- Only this purchase's own marker is cleared: every marker ends with `:<request id>`
-- (see seckill_store::ledger). A newer purchase of the same buyer stands, and so does its
-- result. Safe to run again: a second run finds no marker of this purchase.
-- KEYS[1] buyers hash of the home bucket (user id -> marker)
-- KEYS[2] results hash of the home bucket (user id -> buyer-visible result)
-- ARGV[1] user id, ARGV[2] event id (the purchase's request id), ARGV[3] result text,
-- ARGV[4] the purchase's order id, '' if it never became an order
-- Returns: 1 marker cleared, 2 no marker but the result was this purchase's (or none),
-- 0 another purchase of this buyer stands: nothing changed.
local suffix = ':' .. ARGV[2]
local marker = redis.call('HGET', KEYS[1], ARGV[1])
if marker then
  if string.sub(marker, -#suffix) ~= suffix then
    return 0
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
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 2
