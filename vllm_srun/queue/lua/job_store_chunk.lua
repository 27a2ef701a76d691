-- Stores one chunk's result lines (ARGV[6..], four per line: index, kind, line, head length)
-- of job ARGV[5]: a line is written only where its index has none yet, and only then counted,
-- limited and streamed, so a chunk run again counts nothing twice. Finishes the job when its
-- last chunk is stored. The dollar placeholders (result kinds, HSET batch) are filled in by
-- vllm_srun.queue.jobs.records when the script is loaded.
local FAILED, CACHED, SKIPPED = '$failed', '$cached', '$skipped'
local results, job, events, chunks = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local items, bytes, totals = KEYS[5], KEYS[6], KEYS[7]
local chunk, n_chunks, now, ttl, id = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), ARGV[5]
-- Jobs made before the quotas existed carry no limits and are not accounted.
local limits = redis.call('HMGET', job, 'max_result_bytes', 'max_stored_bytes')
local job_max, all_max = tonumber(limits[1]), tonumber(limits[2])
local accounted = redis.call('HEXISTS', items, id) == 1
-- The byte counts are read once and kept here, and every counter is written once per chunk.
-- Which lines are stored already is read once too (a line already stored is neither stored,
-- counted, limited nor streamed again); the new lines go in one HSET, and one `results` event
-- names them all.
local used, all = 0, 0
if job_max then
  used = tonumber(redis.call('HGET', bytes, id) or '0')
  all = tonumber(redis.call('HGET', totals, 'bytes') or '0')
end
local fields = {}
for i = 6, #ARGV, 4 do fields[#fields + 1] = ARGV[i] end
local had = {}
for i = 1, #fields, $hset_batch do
  local got = redis.call('HMGET', results, unpack(fields, i, math.min(#fields, i + $hset_batch - 1)))
  for j = 1, #got do had[i + j - 1] = got[j] end
end
local n_stored, n_bytes, n_done, n_failed, n_cached, n_skipped = 0, 0, 0, 0, 0, 0
local new, stored = {}, {}
for i = 6, #ARGV, 4 do
  local line, kind = ARGV[i + 2], ARGV[i + 1]
  if had[(i - 2) / 4] then line = nil end
  if line then
    if job_max then
      local limit = nil
      if used + #line > job_max then limit = job_max .. ' bytes of results per job (--max-job-result-bytes)'
      elseif all + #line > all_max then limit = all_max .. ' bytes of results of all jobs (--max-stored-result-bytes)' end
      if limit then
        line = string.sub(line, 1, tonumber(ARGV[i + 3])) .. ',"error":{"code":"result_too_large",'
          .. '"message":"result not stored: it would pass ' .. limit .. '"}}'
        kind = FAILED
      end
    end
    new[#new + 1] = ARGV[i]
    new[#new + 1] = line
    stored[#stored + 1] = ARGV[i]
    n_stored, n_bytes = n_stored + 1, n_bytes + #line
    used, all = used + #line, all + #line
    if kind == FAILED or kind == SKIPPED then n_failed = n_failed + 1 else n_done = n_done + 1 end
    if kind == CACHED then n_cached = n_cached + 1 end
    if kind == SKIPPED then n_skipped = n_skipped + 1 end
  end
end
for i = 1, #new, 2 * $hset_batch do
  redis.call('HSET', results, unpack(new, i, math.min(#new, i + 2 * $hset_batch - 1)))
end
if n_stored > 0 then
  -- One entry for the lines stored here, with an id that leaves a sequence number below it for
  -- each of them: the line k of n is event ms-(seq-n+1+k) to a reader (`_expand`), so a reader
  -- resumes after any one line. Above the stream's last id, whatever the clocks say.
  local ms, seq = math.floor(tonumber(now) * 1000), n_stored - 1
  local last = redis.call('XREVRANGE', events, '+', '-', 'COUNT', 1)
  if #last > 0 then
    local last_ms, last_seq = string.match(last[1][1], '^(%d+)-(%d+)$$')
    last_ms, last_seq = tonumber(last_ms), tonumber(last_seq)
    if ms <= last_ms then ms, seq = last_ms, last_seq + n_stored end
  end
  redis.call('XADD', events, string.format('%.0f-%.0f', ms, seq), 'event', 'results',
             'indices', table.concat(stored, ','))
end
if accounted and n_stored > 0 then
  redis.call('HINCRBY', items, id, -n_stored)
  redis.call('HINCRBY', bytes, id, n_bytes)
  redis.call('HINCRBY', totals, 'items', -n_stored)
  redis.call('HINCRBY', totals, 'bytes', n_bytes)
end
if n_done > 0 then redis.call('HINCRBY', job, 'done', n_done) end
if n_failed > 0 then redis.call('HINCRBY', job, 'failed', n_failed) end
if n_cached > 0 then redis.call('HINCRBY', job, 'cached', n_cached) end
if n_skipped > 0 then redis.call('HINCRBY', job, 'skipped', n_skipped) end
redis.call('SADD', chunks, chunk)
local c = redis.call('HMGET', job, 'total', 'done', 'failed', 'cached', 'status', 'skipped')
local progress = cjson.encode({total = tonumber(c[1]), done = tonumber(c[2]), failed = tonumber(c[3]),
                               cached = tonumber(c[4])})
redis.call('XADD', events, '*', 'event', 'progress', 'data', progress)
local status = c[5]
if redis.call('SCARD', chunks) >= n_chunks and status ~= 'completed' and status ~= 'failed'
   and status ~= 'cancelled' then
  local final = 'completed'
  -- A cancel that came after every chunk had started skipped nothing: the job completed.
  if status == 'cancelling' and tonumber(c[6] or '0') > 0 then final = 'cancelled'
  elseif tonumber(c[3]) == tonumber(c[1]) and tonumber(c[1]) > 0 then final = 'failed' end
  redis.call('HSET', job, 'status', final, 'finished_at', now)
  redis.call('XADD', events, '*', 'event', 'status', 'data', cjson.encode({status = final}))
  if accounted then  -- nothing of it is queued any more
    redis.call('HINCRBY', totals, 'items', 0 - tonumber(redis.call('HGET', items, id) or '0'))
    redis.call('HSET', items, id, 0)
  end
end
for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ttl) end
return 1
