-- GCRA rate limit shared by every gateway replica: one step per request, one key.
--
-- KEYS[1]  the bucket of one client for one quota, `<ns>:ratelimit:{<client>}:<quota>`. It
--          holds the theoretical arrival time (TAT) in microseconds of Redis' clock, and
--          expires when the bucket would be full again, so idle clients cost nothing.
-- ARGV[1]  emission interval, microseconds (1_000_000 / requests per second)
-- ARGV[2]  burst: requests allowed at once from a full bucket
--
-- Returns {allowed, remaining, retry_after_us}:
--   {1, remaining, 0}         allowed; `remaining` more would pass right now
--   {0, 0, retry_after_us}    refused; the next request passes in `retry_after_us`
--
-- Redis' own clock (TIME) is the only clock, so replicas with skewed clocks agree.

local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local new_tat = tat + interval
local allow_at = new_tat - burst * interval
if now < allow_at then
  return {0, 0, allow_at - now}
end

-- '%.0f': a bare number would be written as 1.7e+15 and lose the microseconds.
redis.call('SET', KEYS[1], string.format('%.0f', new_tat),
  'PX', math.ceil((new_tat - now) / 1000))
return {1, math.floor((now - allow_at) / interval), 0}
