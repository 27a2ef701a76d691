-- Takes an Idempotency-Key over for a new job only if it still names the lost one: of two
-- requests that find the same job lost, one creates the replacement.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0
