-- Moves a job to ARGV[1] only from one of the statuses ARGV[2..]: a cancel never overwrites a
-- final status, and a chunk starting never overwrites a cancel.
local status = redis.call('HGET', KEYS[1], 'status')
for i = 2, #ARGV do
  if status == ARGV[i] then
    redis.call('HSET', KEYS[1], 'status', ARGV[1])
    return 1
  end
end
return 0
