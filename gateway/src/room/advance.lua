-- One admission step of a product's waiting room, run by every gateway every tick: any
-- number of gateways may run it, the clock (ARGV[1]) decides how far the cursor moves.
-- KEYS[1] room hash, KEYS[2] admits (zset: member the cursor after an admission, score
-- its ms), KEYS[3] bought (zset: member user id, score place)
-- ARGV[1] now ms, ARGV[2] admissions per second, ARGV[3] margin percent,
-- ARGV[4] pass lifetime ms, ARGV[5] ms after which an admitted buyer who has not bought
-- counts as one who may not, ARGV[6] units left (read from the stock buckets just before),
-- ARGV[7] return admissions from this ms on, ARGV[8] the bought set's size when the units
-- left were read, ARGV[9] how long (ms) after the backends last pushed back (a purchase with
-- a pass answered 502, 503 or 504: the room hash's `pushback_ms`) the admission rate stays
-- held to what they accepted
-- Returns {mode, start, end, joined, cursor, sold out (0/1), floor, outstanding, line,
-- entries, seed, rate, admits...} where floor is the cursor before the first admission returned,
-- line the number seckill-api named the line with when it created the room, entries and
-- seed a raffle's once entry closed (-1 and '' until then; for fifo, '' and any entries a
-- raffle the room once was recorded), rate the admissions
-- per second this step credited (ARGV[2], or its ceiling while held), and admits are
-- pairs (cursor after, ms). The cursor counts ranks: places, or in a raffle the draw's.
-- A raffle's entry closes at the first step (or join) from the sale's start on: the places
-- handed out before it are drawn; the seed is returned from then on, never before.
-- The accepted rate: the bought set's growth over a window of at least a second (`rate_ms`
-- its start, `rate_bought` the set's size then), kept as `accepted_per_sec`. While the
-- backends pushed back in the last ARGV[9] ms, the rate is at most a quarter above it, and
-- at least one a second (a room never stalls); before any window closed, ARGV[2].
local room = KEYS[1]
local f = redis.call('HMGET', room, 'mode', 'start_ms', 'end_ms', 'joined', 'cursor',
  'advanced_ms', 'credit', 'settled', 'line', 'entries', 'seed', 'rate_ms', 'rate_bought',
  'accepted_per_sec', 'pushback_ms')
local mode = f[1] or ''
local start_ms, end_ms = tonumber(f[2]), tonumber(f[3])
if (mode ~= 'fifo' and mode ~= 'raffle') or start_ms == nil or end_ms == nil then
  return {mode, 0, 0, 0, 0, 0, 0, 0, 0, -1, '', 0}
end
local now = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local margin_pct = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local no_show = tonumber(ARGV[5])
local remaining = tonumber(ARGV[6])
local since = tonumber(ARGV[7])
local hold = tonumber(ARGV[9])
local bought_size = redis.call('ZCARD', KEYS[3])
-- Purchases recorded since the buckets were read: their units are no longer left to admit
-- buyers for (some may be counted twice: fewer admitted for a tick, never more). The room
-- is sold out by the buckets alone.
local left = math.max(0, remaining - (bought_size - tonumber(ARGV[8])))
local joined = tonumber(f[4]) or 0
local cursor = tonumber(f[5]) or 0
local advanced = tonumber(f[6]) or now
-- A gateway whose step reads an earlier time than the last step's (its clock behind, or its
-- step late) takes the step at the last one's time: time never goes back here, so no second
-- is counted twice and every admission is scored no earlier than those before it.
if now < advanced then
  now = advanced
end
local entries = tonumber(f[10]) or -1
if mode == 'raffle' and entries < 0 and now >= start_ms then
  entries = joined
  redis.call('HSET', room, 'entries', entries)
end
local seed = ''
if mode == 'raffle' and entries >= 0 then
  seed = f[11] or ''
end
local rate_ms, rate_bought = tonumber(f[12]), tonumber(f[13])
local accepted = tonumber(f[14])
-- Windows start at the sale's start at the earliest: nothing is accepted before it, and a
-- rate measured then would hold the first second's admissions to one.
if rate_ms == nil or rate_bought == nil or now < rate_ms or now < start_ms then
  rate_ms, rate_bought = now, bought_size
elseif now - rate_ms >= 1000 then
  -- A bought set lost (the line started again) counts as nothing accepted, never less.
  accepted = math.max(0, bought_size - rate_bought) * 1000 / (now - rate_ms)
  rate_ms, rate_bought = now, bought_size
  redis.call('HSET', room, 'accepted_per_sec', accepted)
end
local pushback = tonumber(f[15])
if pushback ~= nil and accepted ~= nil and now - pushback < hold then
  rate = math.min(rate, math.max(1, math.ceil(accepted * 1.25)))
end
local credit = tonumber(f[7]) or 0
local settled = tonumber(f[8]) or 0
local admits = KEYS[2]

-- The cursor as it stood `age` ms ago: the newest admission at or before then.
local function cursor_before(age)
  local older = redis.call('ZREVRANGEBYSCORE', admits, now - age, '-inf', 'LIMIT', 0, 1)
  if older[1] then
    return tonumber(older[1])
  end
  return settled
end
settled = math.max(settled, cursor_before(ttl))
local assumed = math.max(settled, cursor_before(no_show))
-- Admitted, not bought: all whose passes may still be used, and the recent ones.
local bought_all = redis.call('ZCOUNT', KEYS[3], settled, '+inf')
local bought_recent = redis.call('ZCOUNT', KEYS[3], assumed, '+inf')
local outstanding = math.max(0, cursor - settled - bought_all)
local recent = math.max(0, cursor - assumed - bought_recent)

local sold_out = 0
if remaining <= 0 then
  sold_out = 1
end
local dt = math.max(0, math.min(now - advanced, 1000))
-- A raffle closed without a seed (a room set up by a seckill-api that wrote none) has no
-- order to admit in: nobody is, until a seed is there.
if now < start_ms or now >= end_ms or sold_out == 1 or (mode == 'raffle' and seed == '') then
  credit = 0
else
  credit = math.min(credit + rate * dt / 1000, math.max(rate, 1))
  local margin = math.max(1, math.floor(left * margin_pct / 100))
  local room_for = math.min(left - recent, left + margin - outstanding)
  local n = math.min(math.floor(credit), room_for, joined - cursor)
  if n > 0 then
    cursor = cursor + n
    credit = credit - n
    redis.call('ZADD', admits, now, cursor)
    outstanding = outstanding + n
  end
end
-- Keep what the oldest pass still needs, and a little more for gateways a tick behind.
redis.call('ZREMRANGEBYSCORE', admits, '-inf', now - ttl - 10000)
redis.call('HSET', room, 'cursor', cursor, 'advanced_ms', now, 'credit', credit,
  'settled', settled, 'sold_out', sold_out, 'rate_ms', rate_ms, 'rate_bought', rate_bought)
if cursor > 0 then
  redis.call('PEXPIREAT', admits, end_ms + 86400000)
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PEXPIREAT', KEYS[3], end_ms + 86400000)
end

local reply = {mode, start_ms, end_ms, joined, cursor, sold_out, 0, outstanding,
  tonumber(f[9]) or 0, entries, seed, rate}
-- From `since` on, inclusive: an admission scored at the very ms of the caller's newest one
-- may be another gateway's (the caller skips those it has, by cursor).
local newer = redis.call('ZRANGEBYSCORE', admits, since, '+inf', 'WITHSCORES')
local floor = redis.call('ZREVRANGEBYSCORE', admits, '(' .. since, '-inf', 'LIMIT', 0, 1)
reply[7] = tonumber(floor[1]) or settled
for i = 1, #newer do
  reply[12 + i] = tonumber(newer[i])
end
return reply
