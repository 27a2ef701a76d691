-- Claims up to ARGV[8] due jobs (of the first ARGV[9] due entries of KEYS[1]) in one step, as
-- arq's poll iteration (ZRANGEBYSCORE), start_jobs (WATCH, EXISTS, MULTI/PSETEX/EXEC per job) and
-- run_job's first pipeline (GET the body, INCR and EXPIRE the retry counter) do one after another:
-- a job is taken when it is due and no worker holds it. Each job taken is leased (KEYS[2]) in the
-- same step, so no claimed job is ever without a lease. Per job: id, score, crash count, body
-- ('' when it expired), try and the request ids withdrawn from it (keys.withdrawn_key).
local now, ttl, prefix = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local lease_until, crashes, job, retry = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local free, withdrawn = tonumber(ARGV[8]), ARGV[10]
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[9]))
local out = {}
for i = 1, #due, 2 do
  if free <= 0 then break end
  local id = due[i]
  if redis.call('EXISTS', prefix .. id) == 0 then
    redis.call('PSETEX', prefix .. id, ttl, '1')
    redis.call('ZADD', KEYS[2], lease_until, id)
    local try = redis.call('INCR', retry .. id)
    redis.call('EXPIRE', retry .. id, 88400)
    table.insert(out, id)
    table.insert(out, due[i + 1])
    table.insert(out, redis.call('GET', crashes .. id) or '0')
    table.insert(out, redis.call('GET', job .. id) or '')
    table.insert(out, try)
    table.insert(out, redis.call('SMEMBERS', withdrawn .. id))
    free = free - 1
  end
end
return out
