-- Release a lock only if we still own it (compare-and-delete).
-- KEYS[1] lock key
-- ARGV[1] the token we set
-- Returns: 1 released, 0 not ours (expired and maybe taken by another loader).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
