-- Looks up result keys (KEYS[3..], none: queues at once) and, only when none is there, queues
-- the arq job (body ARGV[1] under KEYS[2], entry ARGV[4] in the queue KEYS[1] at ARGV[3]) and
-- wakes the workers (ARGV[5]), as `add_job` and a publish would: a request whose inputs all miss
-- costs one round trip.
local found = {}
if #KEYS > 2 then found = redis.call('MGET', unpack(KEYS, 3)) end
for i = 1, #found do
  if found[i] then return found end
end
redis.call('PSETEX', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('PUBLISH', ARGV[5], '1')
return found
