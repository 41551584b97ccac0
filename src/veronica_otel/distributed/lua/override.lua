-- KEYS: the chain hash. ARGV: duration_us add_cost_nano add_steps chain_ttl_ms,
-- the client's marks (8), fresh_epoch.
-- Lifts the sticky trip and widens the ceilings until now + duration (server
-- clock); ov + 1 tells every client the lift was an override. Returns
-- {lifted_trip or '', reseeded, report...}, or {'-'} when the chain does not
-- exist and the client has no marks of it (nothing to override).
local key = KEYS[1]
local st = state(key)
local m = marks(4)
if m.e == '' and redis.call('EXISTS', key) == 0 then return {'-'} end
local reseeded = sync(key, st, m, ARGV[5 + M], ARGV[4])
local trip = read(key, 'trip')[1]
local now = now_us()
redis.call('HDEL', key, 'trip')
redis.call('HSET', key, 'oe', fmt(now + tonumber(ARGV[1])), 'oc', ARGV[2], 'os', ARGV[3])
redis.call('HINCRBY', key, 'ov', 1)
redis.call('PEXPIRE', key, ARGV[4])
return report({trip or '', reseeded}, 1)
