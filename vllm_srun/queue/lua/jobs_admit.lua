-- Forgets the jobs whose data expired (at most ARGV[2] of them), then admits one of ARGV[3]
-- items if the totals allow: 0, or 1 (items) / 2 (bytes) with the total that refused it.
local live, items, bytes, totals = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, purge = tonumber(ARGV[1]), tonumber(ARGV[2])
local job, n, keep_until = ARGV[3], tonumber(ARGV[4]), ARGV[5]
local max_items, max_bytes = tonumber(ARGV[6]), tonumber(ARGV[7])
for _, old in ipairs(redis.call('ZRANGEBYSCORE', live, '-inf', now, 'LIMIT', 0, purge)) do
  redis.call('HINCRBY', totals, 'items', 0 - tonumber(redis.call('HGET', items, old) or '0'))
  redis.call('HINCRBY', totals, 'bytes', 0 - tonumber(redis.call('HGET', bytes, old) or '0'))
  redis.call('HDEL', items, old)
  redis.call('HDEL', bytes, old)
  redis.call('ZREM', live, old)
end
local t = redis.call('HMGET', totals, 'items', 'bytes')
local queued, stored = tonumber(t[1] or '0'), tonumber(t[2] or '0')
if n > 0 and queued + n > max_items then return {1, queued} end
if stored >= max_bytes then return {2, stored} end
if job == '' then return {0, 0} end
redis.call('ZADD', live, keep_until, job)
redis.call('HSET', items, job, n)
redis.call('HSET', bytes, job, 0)
redis.call('HINCRBY', totals, 'items', n)
return {0, 0}
