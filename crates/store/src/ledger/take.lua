-- Take one unit from a bucket for a buyer whose home bucket is dry (a sweep step).
--
-- KEYS[1] stock hash of this bucket
-- KEYS[2] takers hash (user id -> <reservation ms>:<request id>), to find the unit again
--         if the sweeping replica dies before closing its reservation
-- KEYS[3] outbox stream of this bucket
-- ARGV[1] user id, ARGV[2] request id, ARGV[3] order message JSON, ARGV[4] HTTP request id
-- ARGV[5] the reservation time (ms, from reserve.lua), ARGV[6] fence ms
-- ARGV[7] W3C traceparent of the purchase, ARGV[8] its tracestate ('' or absent: none)
-- Returns {code, detail}: {1, outbox entry id} taken; {0, ''} this bucket is dry; {-2, ''}
-- the sale window closed; {-3, ''} not loaded; {-4, ''} the reservation is older than the
-- fence (nothing taken).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {-3, ''}
end
local stock = redis.call('HMGET', KEYS[1], 'remaining', 'end_ms', 'expire_at')
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if now > tonumber(ARGV[5]) + tonumber(ARGV[6]) then
  return {-4, ''}
end
if now >= tonumber(stock[2]) then
  return {-2, ''}
end
if tonumber(stock[1]) <= 0 then
  return {0, ''}
end
redis.call('HINCRBY', KEYS[1], 'remaining', -1)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[5] .. ':' .. ARGV[2])
if redis.call('PTTL', KEYS[2]) == -1 then
  redis.call('PEXPIREAT', KEYS[2], stock[3])
end
local entry = append_outbox(KEYS[3], ARGV[2], ARGV[3], ARGV[4], ARGV[7], ARGV[8])
return {1, entry}
