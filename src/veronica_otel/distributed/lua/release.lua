-- KEYS: chain hashes (n, root first), reservation hash, expiry zset, applied zset.
-- ARGV: n id reserved_cost reserved_tokens steps retry chain_ttl_ms, then per
--       level the client's marks (8), then fresh_epoch applied_ttl_us applied_cap
--       reservation_ttl_us.
-- Returns {0, '', reseeded, report...}.
local n = tonumber(ARGV[1])
local id, rcost, rtokens = ARGV[2], ARGV[3], ARGV[4]
local nsteps, retry, chain_ttl = tonumber(ARGV[5]), ARGV[6] == '1', ARGV[7]
local mb = 7
local fresh = ARGV[mb + M * n + 1]
local aptl, cap = tonumber(ARGV[mb + M * n + 2]), tonumber(ARGV[mb + M * n + 3])
local rsv_ttl = tonumber(ARGV[mb + M * n + 4])
local rh, rz, ad = KEYS[n + 1], KEYS[n + 2], KEYS[n + 3]
local states = {}
for i = 1, n do states[i] = state(KEYS[i]) end
local how, cc, ct, hw = standing(rh, rz, ad, id, n)
if how == 'done' then return report({0, '', 0}, n) end
local reseeded = 0
local now = now_us()
local rsv = {rh, rz, now, rsv_ttl}
for i = 1, n do
  reseeded = reseeded + sync(KEYS[i], states[i], marks(mb + (i - 1) * M), fresh, chain_ttl, rsv)
end
applied(rh, rz, ad, id, n, now, aptl, cap)
-- The record says how many steps (and whether a retry) it holds: those go back.
local rsteps, rretry = held_steps(rh, id, hw)
if rsteps then nsteps, retry = rsteps, rretry end
-- Without a record the reservation was lost with the store: its step may
-- have been re-seeded from marks, so it stays counted (never less).
if how == 'none' then
  for i = 1, n do unghost(KEYS[i], rh, rz, tonumber(rcost), tonumber(rtokens)) end
end
if how ~= 'none' then
  for i = 1, n do
    local key = KEYS[i]
    if how == 'held' then  -- the record's amounts (a cancelled reserve sends 0 0)
      if cc > 0 then redis.call('HINCRBY', key, 'rc', fmt(-cc)) end
      if ct > 0 then redis.call('HINCRBY', key, 'rt', fmt(-ct)) end
    elseif how == 'charged' then  -- never sent: what the reaper charged goes back
      respend(key, 'c', 'k', -cc)
      respend(key, 't', 'kt', -ct)
    end
    if nsteps > 0 then redis.call('HINCRBY', key, 's', -nsteps) end
    if retry then redis.call('HINCRBY', key, 'r', -1) end
    redis.call('PEXPIRE', key, chain_ttl)
  end
end
return report({0, '', reseeded}, n)
