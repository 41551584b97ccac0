-- KEYS: the pools' rh and rz. ARGV: reservation_ttl_us chain_ttl_ms id...
-- Keeps each id whose record is still held alive until now + reservation_ttl.
local until_us = fmt(now_us() + tonumber(ARGV[1]))
local renewed = 0
for j = 3, #ARGV do
  local rec = probe('HGET', KEYS[1], ARGV[j])
  if rec and string.sub(rec, 1, 2) ~= 'C ' then
    probe('ZADD', KEYS[2], 'XX', until_us, ARGV[j])
    renewed = renewed + 1
  end
end
if renewed > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return renewed
