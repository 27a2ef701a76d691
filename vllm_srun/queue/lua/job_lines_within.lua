-- The stored result lines of `ARGV[3..]` (false where none), in order, until they would pass
-- ARGV[1] bytes (at least one line; lines past ARGV[2] are not read): a stream's read is
-- bounded in bytes, however large the lines.
local out, total, cap = {}, 0, tonumber(ARGV[1])
for i = 3, math.min(#ARGV, 2 + tonumber(ARGV[2])) do
  local line = redis.call('HGET', KEYS[1], ARGV[i])
  local size = line and #line or 4
  if i > 3 and total + size > cap then break end
  total = total + size
  out[#out + 1] = line
end
return out
