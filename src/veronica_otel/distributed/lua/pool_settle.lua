local a = pool_args(ARGV, 0)
local reseeded = pool_settle(KEYS, 0, ARGV, a, @COMMIT@, pool_now(a))
return pool_report({unpack(KEYS, 1, a.np)}, a.np, {0, '', 0, reseeded})
