-- Decide one purchase in the buyer's home bucket, atomically, and record it in the outbox.
--
-- The buyer's home bucket holds their purchase marker, so "one unit per user" is decided
-- here whatever bucket the unit finally comes from. All keys share the bucket's hash tag:
-- one Redis Cluster slot.
-- KEYS[1] stock hash of the home bucket {remaining, start_ms, end_ms, expire_at, v, ...}
-- KEYS[2] buyers hash (user id -> marker: h:<request id> bought here,
--         t<bucket>:<request id> bought from another bucket, o:<request id> loaded from
--         Postgres, r:<ms>:<request id> reservation of a sweep in progress; see
--         seckill_store::ledger)
-- KEYS[3] outbox stream
-- KEYS[4] results hash (user id -> buyer-visible result)
-- ARGV[1] user id, ARGV[2] request id, ARGV[3] order message JSON, ARGV[4] HTTP request id
-- ARGV[5] ms after which a reservation counts as abandoned (its sweep cannot take any more)
-- ARGV[6] W3C traceparent of the purchase, ARGV[7] its tracestate ('' or absent: none), kept
--         in the outbox entry so the relay publishes it in the trace of the click
-- Returns {code, detail}, detail '' unless said otherwise:
--   { 1, entry id} accepted from the home bucket; the order intent is that outbox entry
--   { 0} the home bucket is dry (nothing reserved; the caller sweeps the other buckets)
--   {-1} this user already holds a unit (or is buying one right now)
--   {-2} outside the sale window (Redis' clock: one clock for every replica)
--   {-3} bucket not loaded (the caller loads the product and retries)
--   {-5, marker} an abandoned reservation: the caller resolves it, then retries
-- A bucket is loaded whole (load.lua writes every field at once): no window, not loaded.
local stock = redis.call('HMGET', KEYS[1], 'remaining', 'start_ms', 'end_ms', 'expire_at')
if not stock[2] then
  return {-3, ''}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if now < tonumber(stock[2]) or now >= tonumber(stock[3]) then
  return {-2, ''}
end
local marker = redis.call('HGET', KEYS[2], ARGV[1])
if marker then
  local reserved_at = string.match(marker, '^r:(%d+)')
  if reserved_at and now - tonumber(reserved_at) > tonumber(ARGV[5]) then
    return {-5, marker}
  end
  return {-1, ''}
end
if tonumber(stock[1]) <= 0 then
  return {0, ''}
end
redis.call('HINCRBY', KEYS[1], 'remaining', -1)
redis.call('HSET', KEYS[2], ARGV[1], 'h:' .. ARGV[2])
local entry = append_outbox(KEYS[3], ARGV[2], ARGV[3], ARGV[4], ARGV[6], ARGV[7])
redis.call('HSET', KEYS[4], ARGV[1], 'queued:' .. ARGV[2])
-- Markers and results outlive the sale by a while (expire_at), then free the memory.
for _, key in ipairs({KEYS[2], KEYS[4]}) do
  if redis.call('PTTL', key) == -1 then
    redis.call('PEXPIREAT', key, stock[4])
  end
end
return {1, entry}
