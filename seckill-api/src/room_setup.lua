-- Writes a waiting room's set-up (seckill_api::room) into its hash, leaving the gateway's
-- counters (the hash's other fields) as they are, and sets the hash's expiry.
-- KEYS[1] the room's hash
-- ARGV[1] '1': only if the hash exists (a room turned off); '0': whatever it holds
-- ARGV[2..6] mode, start_ms, end_ms, stock, buckets
-- ARGV[7] unix ms at which the hash expires
-- ARGV[8] a random number naming the line, kept only by the write that creates the hash: a
-- line started again (its hash lost with Redis) is another line, and the gateway's tickets
-- and passes of the lost one do not verify in it
-- ARGV[9] a random seed (64 hex digits) for a raffle's draw, kept likewise: the gateway
-- publishes its SHA-256 before the sale and the seed itself once entry closes, so a seed
-- chosen after seeing the entries would not match what was published
-- Returns 1 when written, 0 when there was no room to turn off.
if ARGV[1] == '1' and redis.call('EXISTS', KEYS[1]) == 0 then
    return 0
end
redis.call('HSETNX', KEYS[1], 'line', ARGV[8])
redis.call('HSETNX', KEYS[1], 'seed', ARGV[9])
redis.call('HSET', KEYS[1], 'mode', ARGV[2], 'start_ms', ARGV[3], 'end_ms', ARGV[4],
    'stock', ARGV[5], 'buckets', ARGV[6])
redis.call('PEXPIREAT', KEYS[1], ARGV[7])
return 1
