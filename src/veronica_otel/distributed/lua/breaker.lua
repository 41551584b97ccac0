-- KEYS: the breaker hash (st closed|open, f failures, at opened_at_us,
--       p probe token, pe probe expiry_us). HALF_OPEN is OPEN past the
--       recovery timeout; its single probe slot is the token in p.
-- ARGV: op (check|success|failure|release|state) token any threshold
--       recovery_us probe_ttl_us key_ttl_ms.
-- check -> {1, claimed_probe} or {0, state, failures, retry_in_us};
-- state -> {state, failures}; others -> nil.
local key = KEYS[1]
local op, token, any = ARGV[1], ARGV[2], ARGV[3] == '1'
local threshold, recovery, probe_ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local key_ttl = ARGV[7]
local v = read(key, 'st', 'f', 'at', 'p', 'pe')
local stored = v[1] or 'closed'
if stored ~= 'closed' and stored ~= 'open' then fail(key, 'st', stored) end
local failures, opened = int(key, 'f', v[2]), int(key, 'at', v[3])
local holder, expiry = v[4], int(key, 'pe', v[5])
local now = now_us()
local state = stored
if stored == 'open' and now - opened >= recovery then state = 'half_open' end
if op == 'state' then return {state, failures} end
if op == 'check' then
  if state == 'closed' then return {1, 0} end
  if state == 'half_open' and (holder == false or expiry <= now) then
    redis.call('HSET', key, 'p', token, 'pe', fmt(now + probe_ttl))
    redis.call('PEXPIRE', key, key_ttl)
    return {1, 1}
  end
  local wait = opened + recovery - now
  if wait < 0 then wait = 0 end
  return {0, state, failures, fmt(wait)}
end
if op == 'release' then
  if holder and (any or holder == token) then redis.call('HDEL', key, 'p', 'pe') end
  return false
end
-- success / failure: only CLOSED or the half-open probe's own outcome counts;
-- a late outcome of a call sent before the circuit opened changes nothing.
if state == 'open' then return false end
if state == 'half_open' and not (any or holder == token) then return false end
if op == 'success' then
  if stored == 'closed' and failures == 0 and not holder then return false end
  redis.call('HSET', key, 'st', 'closed', 'f', 0)
else
  failures = failures + 1
  if state == 'half_open' or failures >= threshold then
    redis.call('HSET', key, 'st', 'open', 'at', fmt(now))
  end
  redis.call('HSET', key, 'f', fmt(failures))
end
redis.call('HDEL', key, 'p', 'pe')
redis.call('PEXPIRE', key, key_ttl)
return false
