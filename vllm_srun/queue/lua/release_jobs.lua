-- Gives held jobs back without counting a crash: this worker stops and will not finish them.
for i = 2, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('DEL', ARGV[1] .. ARGV[i])
end
return 1
