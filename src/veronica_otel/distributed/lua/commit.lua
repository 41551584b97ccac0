-- KEYS: chain hashes (n, root first), reservation hash, expiry zset, applied zset.
-- ARGV: n id reserved_cost reserved_tokens cost tokens chain_ttl_ms
--       release_steps (of the reservation's steps, given back: a carve's unused
--       ones), then per
--       level: chain_id cost_nano_limit tokens_limit (-1 = unlimited), then per
--       level the client's marks (8), then fresh_epoch applied_ttl_us applied_cap
--       reservation_ttl_us.
-- Returns {level, trip, reseeded, report...}: level 0 and trip '' unless the
-- amounts overran a level (the first one is returned).
local n = tonumber(ARGV[1])
local id, rcost, rtokens = ARGV[2], ARGV[3], ARGV[4]
local cost, tokens, chain_ttl = ARGV[5], ARGV[6], ARGV[7]
local back = tonumber(ARGV[8])
local mb = 8 + 3 * n
local fresh = ARGV[mb + M * n + 1]
local aptl, cap = tonumber(ARGV[mb + M * n + 2]), tonumber(ARGV[mb + M * n + 3])
local rsv_ttl = tonumber(ARGV[mb + M * n + 4])
local rh, rz, ad = KEYS[n + 1], KEYS[n + 2], KEYS[n + 3]
local states = {}
for i = 1, n do states[i] = state(KEYS[i]) end
local how, cc, ct, hw = standing(rh, rz, ad, id, n)
if how == 'done' then return report({0, '', 0}, n) end
local now = now_us()
local reseeded = 0
local rsv = {rh, rz, now, rsv_ttl}
for i = 1, n do
  reseeded = reseeded + sync(KEYS[i], states[i], marks(mb + (i - 1) * M), fresh, chain_ttl, rsv)
end
if reseeded > 0 then for i = 1, n do states[i] = state(KEYS[i]) end end
applied(rh, rz, ad, id, n, now, aptl, cap)
local held = how == 'held'
-- The record's own step count caps the steps given back (a carve's unused ones).
local rsteps = held_steps(rh, id, hw)
if rsteps and back > rsteps then back = rsteps end
if how == 'none' then
  for i = 1, n do unghost(KEYS[i], rh, rz, tonumber(rcost), tonumber(rtokens)) end
end
-- Without a held reservation nothing was checked against the limits for it.
local over = not held or tonumber(cost) > tonumber(rcost) or tonumber(tokens) > tonumber(rtokens)
local first = {0, ''}
for i = 1, n do
  local key = KEYS[i]
  if held then
    if rcost ~= '0' then redis.call('HINCRBY', key, 'rc', '-' .. rcost) end
    if rtokens ~= '0' then redis.call('HINCRBY', key, 'rt', '-' .. rtokens) end
  end
  -- Unused steps go back as in RELEASE: not when the record was lost (its
  -- steps may have been re-seeded from marks, so they stay counted).
  if back > 0 and how ~= 'none' then redis.call('HINCRBY', key, 's', -back) end
  -- Spent cost and tokens saturate at SATURATE, so every sum a script makes
  -- of them stays exact (see STORE_MAX in the module docstring).
  local c, t = states[i].c, states[i].t
  if how == 'charged' then
    -- The reaper counted the reservation as spent: replace it with the actual.
    respend(key, 'c', 'k', tonumber(cost) - cc)
    respend(key, 't', 'kt', tonumber(tokens) - ct)
    c, t = state(key).c, state(key).t
  else
    if cost ~= '0' then
      c = redis.call('HINCRBY', key, 'c', cost)
      if c > SATURATE then redis.call('HSET', key, 'c', fmt(SATURATE)) end
    end
    if tokens ~= '0' then
      t = redis.call('HINCRBY', key, 't', tokens)
      if t > SATURATE then redis.call('HSET', key, 't', fmt(SATURATE)) end
    end
  end
  if over and not states[i].trip then
    local a = 8 + (i - 1) * 3
    local chain, lcost, ltokens = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    local trip = nil
    if lcost >= 0 and c > lcost then
      trip = limit_trip('cost', lcost / 1e9, c / 1e9, chain, now)
    elseif ltokens >= 0 and t > ltokens then
      trip = limit_trip('tokens', ltokens, t, chain, now)
    end
    if trip then
      redis.call('HSET', key, 'trip', trip)
      if first[1] == 0 then first = {i, trip} end
    end
  end
  redis.call('PEXPIRE', key, chain_ttl)
end
return report({first[1], first[2], reseeded}, n)
