-- One worker's heartbeat (ARGV[3], live until ARGV[2], its engine description ARGV[4]) in the
-- live set KEYS[1] and the engines hash KEYS[2]; the workers that lapsed by ARGV[1] leave both in
-- the same step, so what a dead worker said of its engine does not outlive it.
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, id in ipairs(lapsed) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
return #lapsed
