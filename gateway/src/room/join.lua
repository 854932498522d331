-- A buyer joins a product's waiting room: one place per user, handed out in order. In a
-- raffle the first join from the sale's start on closes entry (`entries`: the places handed
-- out before it take part in the draw) unless the admission step did first.
-- KEYS[1] the room hash, KEYS[2] its tickets hash (user id -> "<place>:<joined ms>")
-- ARGV[1] user id, ARGV[2] now (unix ms)
-- Returns {0} when the room is not on, {-1, start, end} when its sale ended, else
-- {1, place, joined ms, start, end, line}.
local room = redis.call('HMGET', KEYS[1], 'mode', 'start_ms', 'end_ms', 'line', 'entries')
if room[1] ~= 'fifo' and room[1] ~= 'raffle' then
  return {0}
end
local start_ms, end_ms = tonumber(room[2]), tonumber(room[3])
if start_ms == nil or end_ms == nil then
  return {0}
end
local now = tonumber(ARGV[2])
if now >= end_ms then
  return {-1, start_ms, end_ms}
end
local line = tonumber(room[4]) or 0
local held = redis.call('HGET', KEYS[2], ARGV[1])
if held then
  local sep = string.find(held, ':', 1, true)
  return {1, tonumber(string.sub(held, 1, sep - 1)), tonumber(string.sub(held, sep + 1)),
    start_ms, end_ms, line}
end
if room[1] == 'raffle' and room[5] == false and now >= start_ms then
  redis.call('HSET', KEYS[1], 'entries', redis.call('HGET', KEYS[1], 'joined') or 0)
end
local place = redis.call('HINCRBY', KEYS[1], 'joined', 1) - 1
redis.call('HSET', KEYS[2], ARGV[1], place .. ':' .. now)
if place == 0 then
  -- A day past the sale, like the room itself.
  redis.call('PEXPIREAT', KEYS[2], end_ms + 86400000)
end
return {1, place, now, start_ms, end_ms, line}
