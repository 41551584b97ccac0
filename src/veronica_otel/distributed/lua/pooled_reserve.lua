local now = pool_now(a)
if pool_seen(KEYS, ko, a) then  -- a duplicated reserve: the chain reports it
  return pool_report({unpack(KEYS, ko + 1, ko + a.np)}, a.np, chain_op(ckeys, cargs, false))
end
local denied = pool_check(KEYS, ko, ARGV, a, now)
if denied then
  local verdict = chain_op(ckeys, cargs, true)
  for i = 1, #verdict do denied[#denied + 1] = verdict[i] end
  return denied
end
local reply = chain_op(ckeys, cargs, false)
if reply[1] == 1 then pool_hold(KEYS, ko, ARGV, a, now) end
return pool_report({unpack(KEYS, ko + 1, ko + a.np)}, a.np, reply)
