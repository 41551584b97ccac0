-- KEYS: the chain hash. ARGV: trip_json chain_ttl_ms, the client's marks (8),
-- fresh_epoch. Returns {sticky, reseeded, report...}: sticky is '' when this
-- trip was stored, else the sticky one already there.
local key = KEYS[1]
local st = state(key)
local reseeded = sync(key, st, marks(2), ARGV[3 + M], ARGV[2])
local v = read(key, 'trip')
if v[1] then return report({v[1], reseeded}, 1) end
redis.call('HSET', key, 'trip', ARGV[1])
redis.call('PEXPIRE', key, ARGV[2])
return report({'', reseeded}, 1)
