-- Remove a stream from the outbox registry, unless it was registered again since it was read.
--
-- The relay found the stream empty after its sale ended; a load or a window change that
-- could let purchases write to it again registers it first (ZADD GT raises its score), so
-- a changed score means "keep it".
-- KEYS[1] the outbox registry (sorted set: stream -> ms until which it may be written)
-- ARGV[1] the stream, ARGV[2] the score the relay read
-- Returns 1 removed, 0 kept (registered again, or already gone).
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
