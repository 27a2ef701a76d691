-- Puts back the jobs whose leases (KEYS[1]) lapsed before ARGV[1]: a job still queued (KEYS[2])
-- whose body exists loses its in-progress key, so any worker claims it again, and its crash count
-- goes up; a lease on a job that has finished is just dropped. One wake-up (ARGV[6]) for all.
local now, in_progress, job, crashes, crash_ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[7]))
local back = {}
for _, id in ipairs(lapsed) do
  redis.call('ZREM', KEYS[1], id)
  if redis.call('ZSCORE', KEYS[2], id) and redis.call('EXISTS', job .. id) == 1 then
    redis.call('DEL', in_progress .. id)
    redis.call('INCR', crashes .. id)
    redis.call('EXPIRE', crashes .. id, crash_ttl)
    table.insert(back, id)
  end
end
if #back > 0 and ARGV[6] ~= '' then redis.call('PUBLISH', ARGV[6], 'requeued') end
return back
