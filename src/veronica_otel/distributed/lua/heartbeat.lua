-- KEYS: the tree's reservation hash and expiry zset. ARGV: reservation_ttl_us
-- chain_ttl_ms chain_key_base id... Keeps each id whose record is still held
-- alive until now + reservation_ttl, and the keys of its chains for chain_ttl.
-- Returns how many were renewed.
local rh, rz, base = KEYS[1], KEYS[2], ARGV[3]
local until_us = fmt(now_us() + tonumber(ARGV[1]))
local renewed = 0
for j = 4, #ARGV do
  local rec = probe('HGET', rh, ARGV[j])
  if rec and rec ~= 'R' and string.sub(rec, 1, 2) ~= 'C ' then
    probe('ZADD', rz, 'XX', until_us, ARGV[j])
    local k = 0
    for word in string.gmatch(rec, '%S+') do
      k = k + 1
      if k > 2 and string.sub(word, 1, 1) ~= ':' then
        redis.call('PEXPIRE', base .. word, ARGV[2])
      end
    end
    renewed = renewed + 1
  end
end
if renewed > 0 then
  redis.call('PEXPIRE', rh, ARGV[2])
  redis.call('PEXPIRE', rz, ARGV[2])
end
return renewed
