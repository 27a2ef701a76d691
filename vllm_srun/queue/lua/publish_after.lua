-- PUBLISH ARGV[2] on channel ARGV[1], on the slot of KEYS[1] (see redis.publish).
return redis.call('PUBLISH', ARGV[1], ARGV[2])
