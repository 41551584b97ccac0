local reply = chain_op(ckeys, cargs)
pool_settle(KEYS, ko, ARGV, a, @COMMIT@, pool_now(a))
return pool_report({unpack(KEYS, ko + 1, ko + a.np)}, a.np, reply)
