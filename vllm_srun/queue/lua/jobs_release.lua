-- Takes one job out of the accounting (its creation failed).
local live, items, bytes, totals, job = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1]
redis.call('HINCRBY', totals, 'items', 0 - tonumber(redis.call('HGET', items, job) or '0'))
redis.call('HINCRBY', totals, 'bytes', 0 - tonumber(redis.call('HGET', bytes, job) or '0'))
redis.call('HDEL', items, job)
redis.call('HDEL', bytes, job)
redis.call('ZREM', live, job)
return 1
