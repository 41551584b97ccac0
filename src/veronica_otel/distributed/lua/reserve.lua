-- KEYS: chain hashes (n, root first), signature hashes (n), signature recency
--       zsets (n), the tree's reservation hash, expiry zset and applied zset.
-- ARGV: n cost tokens steps retry signature id reservation_ttl_us chain_ttl_ms
--       marker_ttl_us signature_memory chain_key_base, then per level:
--       chain_id steps retries tokens cost_nano repeats (-1 = unlimited), then
--       per level the client's marks (8), then fresh_epoch on_loss(reseed|fail).
-- Returns {code, level, trip, reseeded, report...}: code 1 charged (or this id
-- was reserved or settled before: nothing charged again); 2 denied,
-- the chain tripped (nothing charged); 3 a denial that only other calls'
-- in-flight reservations cause (the call fits against committed spend
-- alone), not stored; 4 the store lost level's chain and on_loss is fail
-- (nothing written).
local n = tonumber(ARGV[1])
local cost, tokens = ARGV[2], ARGV[3]
local ncost, ntokens = tonumber(cost), tonumber(tokens)
-- steps: how many steps this reservation counts (0, 1, or a carve's k <= 1000)
local nsteps, retry = tonumber(ARGV[4]), ARGV[5] == '1'
local sig, id = ARGV[6], ARGV[7]
local rsv_ttl, chain_ttl, marker_ttl = tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10])
local memory, base = tonumber(ARGV[11]), ARGV[12]
local mb = 12 + 6 * n
local fresh, on_loss = ARGV[mb + M * n + 1], ARGV[mb + M * n + 2]
local rh, rz, ad = KEYS[3 * n + 1], KEYS[3 * n + 2], KEYS[3 * n + 3]

-- A reserve delivered again (a retried or duplicated request): its id
-- already has a record (held, or reaped) or was settled. Charge nothing again.
if id ~= '' and (probe('HEXISTS', rh, id) == 1 or probe('ZSCORE', ad, applied_as(id, n))) then
  return report({1, 0, '', 0}, n)
end
local now = now_us()

-- 0. Every level against the caller's marks: re-seed what the store lost.
local mk, reseeded = {}, 0
for i = 1, n do
  local st = state(KEYS[i])
  mk[i] = marks(mb + (i - 1) * M)
  if on_loss == 'fail' and lost(KEYS[i], st, mk[i]) then return report({4, i, '', 0}, n) end
  mk[i].st = st
end
local rsv = {rh, rz, now, rsv_ttl}
for i = 1, n do reseeded = reseeded + sync(KEYS[i], mk[i].st, mk[i], fresh, chain_ttl, rsv) end

-- 1. Charge what expired reservations of this tree hold (their holder died
--    or hung, and the call may have been sent: fail closed): cost and tokens
--    move from reserved to spent, steps stay counted. The record becomes a
--    marker "C cost tokens" until marker_ttl: a late commit then replaces the
--    charge with its actual amounts, a late release gives it back, once.
--    A ghost reservation (id "g...", re-held after a loss) is given back.
probe('HLEN', rh)
local due = probe('ZRANGEBYSCORE', rz, '-inf', fmt(now), 'LIMIT', 0, 64)
local reaped = false
for _, rid in ipairs(due) do
  local rec = probe('HGET', rh, rid)
  if rec == false or rec == 'R' or string.sub(rec, 1, 2) == 'C ' then
    redis.call('ZREM', rz, rid)
    redis.call('HDEL', rh, rid)
  else
    local parts = {}
    for word in string.gmatch(rec, '%S+') do parts[#parts + 1] = word end
    if #parts < 3 then fail(rh, rid, rec) end
    count(rh, rid, parts[1])
    count(rh, rid, parts[2])
    local held = {}
    reaped = true
    local steps = held_steps(rh, rid, parts[3])
    for j = steps and 4 or 3, #parts do
      local key = base .. parts[j]
      state(key)
      if redis.call('EXISTS', key) == 1 then held[#held + 1] = key end
    end
    -- A ghost reservation (id "g...", what calls in flight at a loss held,
    -- re-held from marks) is given back: it may hold calls settled before the
    -- loss that the marks did not see (see "What no client can know").
    local ghost = string.sub(rid, 1, 1) == 'g'
    for _, key in ipairs(held) do
      if parts[1] ~= '0' then redis.call('HINCRBY', key, 'rc', '-' .. parts[1]) end
      if parts[2] ~= '0' then redis.call('HINCRBY', key, 'rt', '-' .. parts[2]) end
      if not ghost then
        respend(key, 'c', 'k', tonumber(parts[1]))
        respend(key, 't', 'kt', tonumber(parts[2]))
      end
    end
    if ghost then
      redis.call('HDEL', rh, rid)
      redis.call('ZREM', rz, rid)
    else
      local marker = 'C ' .. parts[1] .. ' ' .. parts[2]
      if steps then marker = marker .. ' ' .. parts[3] end
      redis.call('HSET', rh, rid, marker)
      redis.call('ZADD', rz, fmt(now + marker_ttl), rid)
    end
  end
end

-- 2. Check every level, root first. The first sticky trip or new trip wins;
--    a denial caused only by in-flight reservations (soft) is not stored,
--    and any trip found on a later check or level still wins over it.
local sizes = {}
local soft = false
local fresh_state = reseeded == 0 and not reaped  -- step 0's reads still hold
for i = 1, n do
  local key = KEYS[i]
  local st = fresh_state and mk[i].st or state(key)
  if st.trip then return report({2, i, st.trip, reseeded}, n) end
  local c, rc, s, r, t, rt = st.c, st.rc, st.s, st.r, st.t, st.rt
  local a = 12 + (i - 1) * 6
  local chain = ARGV[a + 1]
  local lsteps, lretries = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local ltokens, lcost = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  local lrepeats = tonumber(ARGV[a + 6])
  -- A logged override widens the cost and step ceilings until it expires.
  if st.oe > now then
    if lsteps >= 0 then lsteps = lsteps + st.os end
    if lcost >= 0 then lcost = lcost + st.oc end
  end
  local denial, held = nil, nil
  if nsteps > 0 and lsteps >= 0 and s + nsteps > lsteps then
    denial = limit_trip('steps', lsteps, s + nsteps, chain, now)
  elseif retry and lretries >= 0 and r + 1 > lretries then
    denial = limit_trip('retries', lretries, r + 1, chain, now)
  else
    if ltokens >= 0 and t + rt + ntokens > ltokens then
      local only = t + ntokens <= ltokens
      held = limit_trip('tokens', ltokens, t + rt + ntokens, chain, now, only)
      if not only then denial = held end
    end
    if not denial and lcost >= 0 and c + rc + ncost > lcost then
      local only = c + ncost <= lcost
      local d = limit_trip('cost', lcost / 1e9, (c + rc + ncost) / 1e9, chain, now, only)
      if not only then denial = d elseif not held then held = d end
    end
    if not denial and sig ~= '' and lrepeats >= 0 then
      local skey, okey = KEYS[n + i], KEYS[2 * n + i]
      local seen = probe('HGET', skey, sig)
      sizes[i] = probe('ZCARD', okey)
      if seen == false then
        if lrepeats < 1 and redis.call('EXISTS', skey) == 1 then
          denial = limit_trip('loop', lrepeats, 1, chain, now)
        end
      else
        seen = count(skey, sig, seen)
        if seen + 1 > lrepeats then denial = limit_trip('loop', lrepeats, seen + 1, chain, now) end
      end
    end
  end
  if denial then
    redis.call('HSET', key, 'trip', denial)
    redis.call('PEXPIRE', key, chain_ttl)
    return report({2, i, denial, reseeded}, n)
  end
  if held and not soft then soft = {3, i, held, reseeded} end
end
if soft then return report(soft, n) end

-- 3. Charge every level, and record the reservation so it can expire.
local chains = {}
for i = 1, n do
  local key = KEYS[i]
  local a = 12 + (i - 1) * 6
  chains[i] = ARGV[a + 1]
  if nsteps > 0 then redis.call('HINCRBY', key, 's', nsteps) end
  if retry then redis.call('HINCRBY', key, 'r', 1) end
  if ncost > 0 then redis.call('HINCRBY', key, 'rc', cost) end
  if ntokens > 0 then redis.call('HINCRBY', key, 'rt', tokens) end
  if sig ~= '' and tonumber(ARGV[a + 6]) >= 0 then
    local skey, okey = KEYS[n + i], KEYS[2 * n + i]
    redis.call('HINCRBY', skey, sig, 1)
    local q = redis.call('HINCRBY', key, 'q', 1)
    local added = redis.call('ZADD', okey, q, sig)
    if sizes[i] + added > memory then
      local oldest = redis.call('ZPOPMIN', okey, 1)
      redis.call('HDEL', skey, oldest[1])
    end
    redis.call('PEXPIRE', skey, chain_ttl)
    redis.call('PEXPIRE', okey, chain_ttl)
  end
  redis.call('PEXPIRE', key, chain_ttl)
end
if id ~= '' then
  -- "cost tokens :k[r] chain...": k the steps it holds (a carve's k), r a retry.
  local held = cost .. ' ' .. tokens .. ' :' .. fmt(nsteps) .. (retry and 'r' or '')
  redis.call('HSET', rh, id, held .. ' ' .. table.concat(chains, ' '))
  redis.call('ZADD', rz, fmt(now + rsv_ttl), id)
  redis.call('PEXPIRE', rh, chain_ttl)
  redis.call('PEXPIRE', rz, chain_ttl)
end
return report({1, 0, '', reseeded}, n)
