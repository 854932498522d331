-- Decide one purchase atomically and record it in the outbox.
--
-- All keys share the product's hash tag, so this runs on one Redis Cluster slot.
-- KEYS[1] stock hash {remaining, total, start_ms, end_ms}
-- KEYS[2] buyers set (user ids holding a unit)
-- KEYS[3] outbox stream (order intents for the relay)
-- KEYS[4] results hash (user id -> buyer-visible result)
-- ARGV[1] user id
-- ARGV[2] request id (uuid)
-- ARGV[3] order message JSON
-- ARGV[4] HTTP request id (for tracing)
-- The window is checked against Redis' clock, one clock for every replica.
-- Returns: 1 accepted, 0 sold out, -1 already purchased, -2 outside the sale window,
--          -3 stock not loaded (the caller loads it and retries).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -3
end
local window = redis.call('HMGET', KEYS[1], 'start_ms', 'end_ms')
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if now < tonumber(window[1]) or now >= tonumber(window[2]) then
  return -2
end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  return -1
end
if tonumber(redis.call('HGET', KEYS[1], 'remaining')) <= 0 then
  return 0
end
redis.call('HINCRBY', KEYS[1], 'remaining', -1)
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('XADD', KEYS[3], '*', 'request_id', ARGV[2], 'payload', ARGV[3], 'http_request_id', ARGV[4])
redis.call('HSET', KEYS[4], ARGV[1], 'queued:' .. ARGV[2])
return 1
