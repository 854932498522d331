-- Delete the consumers of a stream's relay group that hold nothing and have been idle long:
-- names of replicas that died (every start joins under a new name). Checked and deleted in
-- one step, so a consumer that reads an entry in between is never deleted with it pending.
-- KEYS[1] the outbox stream
-- ARGV[1] the group, ARGV[2] idle ms beyond which a consumer without pending entries goes,
-- ARGV[3] a consumer to keep (the caller's own)
-- Returns how many consumers were deleted (0 if the stream or group does not exist).
local consumers = redis.pcall('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if type(consumers) ~= 'table' or consumers.err then
  return 0
end
local deleted = 0
for _, fields in ipairs(consumers) do
  local consumer = {}
  for i = 1, #fields, 2 do
    consumer[fields[i]] = fields[i + 1]
  end
  if consumer.pending == 0 and consumer.idle > tonumber(ARGV[2]) and consumer.name ~= ARGV[3] then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], consumer.name)
    deleted = deleted + 1
  end
end
return deleted
