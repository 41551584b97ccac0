local function pool_state(key)
  local v = read(key, 'e', 'c', 's', 't', 'rc', 'rs', 'rt', 'wu', 'bu', 'lo', 'ku', 'pn')
  local st = {
    e = v[1], c = int(key, 'c', v[2]), s = int(key, 's', v[3]), t = int(key, 't', v[4]),
    rc = int(key, 'rc', v[5]), rs = int(key, 'rs', v[6]), rt = int(key, 'rt', v[7]),
    wu = int(key, 'wu', v[8]), bu = int(key, 'bu', v[9]), lo = int(key, 'lo', v[10]),
    pn = int(key, 'pn', v[12]), nw = not v[8],
  }
  st.ku = v[11] and int(key, 'ku', v[11]) or st.wu  -- never changed: kept as long as the window
  return st
end
local function pool_total(key, st, field, delta)
  if delta == 0 then return end
  local v = redis.call('HINCRBY', key, field, fmt(delta))
  if v > SATURATE then v = SATURATE; redis.call('HSET', key, field, fmt(v)) end
  if v < 0 then v = 0; redis.call('HSET', key, field, '0') end
  st[field] = v
end
-- Remove every bucket field (their spend is accounted for by the caller).
local function drop_buckets(key)
  local names = probe('HKEYS', key)
  for _, f in ipairs(names) do
    if string.find(f, '^[cst]:') then redis.call('HDEL', key, f) end
  end
end
-- Spend committed now: into the current bucket (windowed) and the totals.
local function pool_spend(key, st, now, c, s, t)
  if c <= 0 and s <= 0 and t <= 0 then return end
  if st.wu > 0 then
    local i = fmt(math.floor(now / st.bu))
    if c > 0 then redis.call('HINCRBY', key, 'c:' .. i, fmt(c)) end
    if s > 0 then redis.call('HINCRBY', key, 's:' .. i, fmt(s)) end
    if t > 0 then redis.call('HINCRBY', key, 't:' .. i, fmt(t)) end
    if st.lo == 0 then st.lo = tonumber(i); redis.call('HSET', key, 'lo', i) end
  end
  pool_total(key, st, 'c', c)
  pool_total(key, st, 's', s)
  pool_total(key, st, 't', t)
end
-- Take back up to c s t of what bucket at (server time, us) holds, if it is
-- still in the window (a reaper's charge replaced by a late settlement).
local function pool_unspend(key, st, at, c, s, t)
  local take = {c, s, t}
  if st.wu > 0 then
    local i = math.floor(at / st.bu)
    if i < st.lo then return end
    local names = {'c:' .. fmt(i), 's:' .. fmt(i), 't:' .. fmt(i)}
    local v = probe('HMGET', key, names[1], names[2], names[3])
    for j = 1, 3 do
      local held = int(key, names[j], v[j])
      if take[j] > held then take[j] = held end
      if take[j] > 0 then
        if take[j] == held then redis.call('HDEL', key, names[j])
        else redis.call('HINCRBY', key, names[j], fmt(-take[j])) end
      end
    end
  end
  pool_total(key, st, 'c', -take[1])
  pool_total(key, st, 's', -take[2])
  pool_total(key, st, 't', -take[3])
end
-- What left the window, kept while a longer window may come back (ku).
local function pool_keep(key, st, newest, c, s, t)
  if st.ku >= 0 and st.ku <= st.wu then return end
  if c > 0 then redis.call('HINCRBY', key, 'pc', fmt(c)) end
  if s > 0 then redis.call('HINCRBY', key, 'ps', fmt(s)) end
  if t > 0 then redis.call('HINCRBY', key, 'pt', fmt(t)) end
  if newest > st.pn then st.pn = newest; redis.call('HSET', key, 'pn', fmt(newest)) end
end
-- Take the lump out (it counts again in the new window), or drop it once
-- even the longest window has passed it.
local function pool_unkeep(key, st, now)
  local v = read(key, 'pc', 'ps', 'pt')
  local c, s, t = int(key, 'pc', v[1]), int(key, 'ps', v[2]), int(key, 'pt', v[3])
  if c == 0 and s == 0 and t == 0 then return 0, 0, 0 end
  local gone = st.ku >= 0 and now >= st.pn + st.ku
  if gone or st.wu == 0 or now < st.pn + st.wu then
    redis.call('HDEL', key, 'pc', 'ps', 'pt', 'pn')
    st.pn = 0
    if not gone then return c, s, t end
  end
  return 0, 0, 0
end
-- Move the window to now: drop buckets whose spend is all older than wu.
-- A changed window or bucket length (wu, bu given) moves what is held into
-- the current bucket (it then stays longer: denies earlier, never later),
-- and so does the lump when the new window reaches it.
local function pool_slide(key, st, now, wu, bu)
  if wu ~= st.wu or bu ~= st.bu then
    if st.wu > 0 then drop_buckets(key) end
    local ku = -1  -- it was a lifetime pool (a new one holding spend was: wu is never written)
    if st.nw and st.c == 0 and st.s == 0 and st.t == 0 then ku = wu  -- new: nothing to keep
    elseif wu > 0 and st.wu > 0 and st.ku >= 0 then ku = math.max(st.ku, st.wu, wu) end
    redis.call('HSET', key, 'wu', fmt(wu), 'bu', fmt(bu), 'lo', '0', 'ku', fmt(ku))
    if ku < 0 then redis.call('PERSIST', key) end
    local c, s, t = st.c, st.s, st.t
    st.wu, st.bu, st.lo, st.ku = wu, bu, 0, ku
    local kc, ks, kt = pool_unkeep(key, st, now)
    st.c, st.s, st.t = 0, 0, 0
    redis.call('HSET', key, 'c', '0', 's', '0', 't', '0')
    pool_spend(key, st, now, c + kc, s + ks, t + kt)
    return
  end
  if wu == 0 or st.lo == 0 then return end
  local last = math.floor((now - wu) / bu) - 1  -- newest bucket all older than wu
  if st.lo > last then return end
  if last - st.lo > wu / bu + 2 then
    drop_buckets(key)
    pool_keep(key, st, (last + 1) * bu, st.c, st.s, st.t)
    st.c, st.s, st.t = 0, 0, 0
    redis.call('HSET', key, 'c', '0', 's', '0', 't', '0')
  else
    local dc, ds, dt = 0, 0, 0
    for i = st.lo, last do
      local names = {'c:' .. fmt(i), 's:' .. fmt(i), 't:' .. fmt(i)}
      local v = probe('HMGET', key, names[1], names[2], names[3])
      if v[1] or v[2] or v[3] then
        dc = dc + int(key, names[1], v[1])
        ds = ds + int(key, names[2], v[2])
        dt = dt + int(key, names[3], v[3])
        redis.call('HDEL', key, names[1], names[2], names[3])
      end
    end
    pool_total(key, st, 'c', -dc)
    pool_total(key, st, 's', -ds)
    pool_total(key, st, 't', -dt)
    pool_keep(key, st, (last + 1) * bu, dc, ds, dt)
  end
  st.lo = last + 1
  redis.call('HSET', key, 'lo', fmt(st.lo))
end
-- Microseconds until `need` of field (c, s or t) will have left the window,
-- or -1 when the window alone cannot free that much (lifetime pool, or
-- other calls' reservations hold the rest).
local function pool_retry(key, st, now, field, need)
  if st.wu == 0 or need > st[field] then return -1 end
  local freed = 0
  for i = st.lo, math.floor(now / st.bu) do
    local name = field .. ':' .. fmt(i)
    local v = probe('HGET', key, name)
    if v then
      freed = freed + int(key, name, v)
      if freed >= need then return (i + 1) * st.bu + st.wu - now end
    end
  end
  return -1
end
-- Bring a pool in line with the client's marks (e c s t): a pool the store
-- lost (no epoch, or another one) gets what the marks saw beyond what it
-- now holds, as spend in the current bucket. Returns 1 when it re-seeded.
local function pool_sync(key, st, me, mc, ms, mt, now, fresh)
  if st.e and st.e == me then return 0 end
  if not st.e then
    redis.call('HSET', key, 'e', fresh)
    st.e = fresh
  end
  if me == '' then return 0 end
  local dc, ds, dt = mc - st.c, ms - st.s, mt - st.t
  pool_spend(key, st, now, math.max(dc, 0), math.max(ds, 0), math.max(dt, 0))
  return 1
end
local function pool_touch(key, st, chain_ttl)
  if st.wu > 0 and st.ku >= 0 then
    local keep = math.max(st.wu, st.ku) + st.bu
    redis.call('PEXPIRE', key, fmt(math.floor(keep / 1000) + tonumber(chain_ttl)))
  end
end
local function words(rec)
  local parts = {}
  for w in string.gmatch(rec, '%S+') do parts[#parts + 1] = w end
  return parts
end
-- Charge (at most 64 of) the expired pool reservations: their holder died or
-- hung and the call may have been sent (fail closed): reserved becomes spent
-- now, and the record a marker "C cost tokens steps at name..." until
-- marker_ttl (a late commit replaces the charge, a late release takes it back).
local function pool_reap(rh, rz, base, now, marker_ttl, chain_ttl)
  local due = probe('ZRANGEBYSCORE', rz, '-inf', fmt(now), 'LIMIT', 0, 64)
  for _, rid in ipairs(due) do
    local rec = probe('HGET', rh, rid)
    if rec == false or string.sub(rec, 1, 2) == 'C ' then
      redis.call('ZREM', rz, rid)
      redis.call('HDEL', rh, rid)
    else
      local p = words(rec)
      if #p < 4 then fail(rh, rid, rec) end
      local c, t, s = count(rh, rid, p[1]), count(rh, rid, p[2]), count(rh, rid, p[3])
      for j = 4, #p do
        local key = base .. p[j]
        if redis.call('EXISTS', key) == 1 then
          local st = pool_state(key)
          pool_slide(key, st, now, st.wu, st.bu)
          pool_total(key, st, 'rc', -c)
          pool_total(key, st, 'rs', -s)
          pool_total(key, st, 'rt', -t)
          pool_spend(key, st, now, c, s, t)
          pool_touch(key, st, chain_ttl)
        end
      end
      redis.call('HSET', rh, rid, 'C ' .. p[1] .. ' ' .. p[2] .. ' ' .. p[3] .. ' ' .. fmt(now)
        .. ' ' .. table.concat(p, ' ', 4))
      redis.call('ZADD', rz, fmt(now + marker_ttl), rid)
    end
  end
end
local function pool_report(keys, np, out)
  for j = 1, np do
    local v = redis.call('HMGET', keys[j], 'e', 'c', 's', 't')
    out[#out + 1] = v[1] or ''
    out[#out + 1] = v[2] or '0'
    out[#out + 1] = v[3] or '0'
    out[#out + 1] = v[4] or '0'
  end
  return out
end
local function pool_args(A, po)
  return {
    np = tonumber(A[po + 1]), id = A[po + 2], cost = tonumber(A[po + 3]),
    tokens = tonumber(A[po + 4]), steps = tonumber(A[po + 5]), base = A[po + 6],
    rsv_ttl = tonumber(A[po + 7]), marker_ttl = tonumber(A[po + 8]),
    aptl = tonumber(A[po + 9]), cap = tonumber(A[po + 10]), fresh = A[po + 11],
    chain_ttl = A[po + 12], chain = A[po + 13], clock = A[po + 14], at = po + 14,
  }
end
-- The pools' clock: the server's TIME, unless a test injected one.
local function pool_now(a)
  if a.clock ~= '' then return tonumber(a.clock) end
  return now_us()
end
local function pool_of(A, a, j)
  local b = a.at + (j - 1) * 10
  return {
    name = A[b + 1], wu = tonumber(A[b + 2]), bu = tonumber(A[b + 3]),
    lcost = tonumber(A[b + 4]), lsteps = tonumber(A[b + 5]), ltokens = tonumber(A[b + 6]),
    me = A[b + 7], mc = tonumber(A[b + 8]), ms = tonumber(A[b + 9]), mt = tonumber(A[b + 10]),
  }
end
-- Check every pool (after sliding its window and re-seeding what the store
-- lost): nil when the call fits in all of them, else the denial
-- {5, j, reason, limit, observed, soft, retry_us, reseeded}, chosen as
-- LocalLedger chooses (PoolAccount): in a pool, the first measure over its
-- limit, or the first that committed spend alone puts over (then not soft);
-- retry_us when every measure over has room again (-1: not by the window
-- alone); across pools, the first hard denial, else the first soft one. A
-- call of no amount is denied too by a pool already over its limit. Writes
-- only upkeep (slides, reaped charges, re-seeds), never a reservation.
local function pool_check(K, ko, A, a, now)
  local rh, rz = K[ko + a.np + 1], K[ko + a.np + 2]
  pool_reap(rh, rz, a.base, now, a.marker_ttl, a.chain_ttl)
  local reseeded, denied = 0, nil
  for j = 1, a.np do
    local key, p = K[ko + j], pool_of(A, a, j)
    local st = pool_state(key)
    reseeded = reseeded + pool_sync(key, st, p.me, p.mc, p.ms, p.mt, now, a.fresh)
    pool_slide(key, st, now, p.wu, p.bu)
    local checks = {
      {'steps', 's', st.s, st.rs, a.steps, p.lsteps},
      {'tokens', 't', st.t, st.rt, a.tokens, p.ltokens},
      {'cost', 'c', st.c, st.rc, a.cost, p.lcost},
    }
    local found, hard, retry = nil, false, 0
    for _, ck in ipairs(checks) do
      local used, held, want, limit = ck[3], ck[4], ck[5], ck[6]
      local total = used + held + want
      if limit >= 0 and total > limit then
        local over = used + want > limit
        if not found or (over and not hard) then found = {ck[1], limit, total} end
        hard = hard or over
        local wait = pool_retry(key, st, now, ck[2], total - limit)
        if retry < 0 or wait < 0 then retry = -1 elseif wait > retry then retry = wait end
      end
    end
    if found and (hard or not denied) then
      denied = {5, j, found[1], fmt(found[2]), fmt(found[3]), hard and 0 or 1, fmt(retry), 0}
    end
    if found and hard then break end
  end
  if denied then denied[8] = reseeded end
  return denied
end
-- Hold the amounts in every pool and record the reservation.
local function pool_hold(K, ko, A, a, now)
  if a.id == '' then return end  -- a call of no amount holds nothing
  local rh, rz = K[ko + a.np + 1], K[ko + a.np + 2]
  local names = {}
  for j = 1, a.np do
    local key, p = K[ko + j], pool_of(A, a, j)
    local st = pool_state(key)
    pool_total(key, st, 'rc', a.cost)
    pool_total(key, st, 'rs', a.steps)
    pool_total(key, st, 'rt', a.tokens)
    pool_touch(key, st, a.chain_ttl)
    names[j] = p.name
  end
  redis.call('HSET', rh, a.id, fmt(a.cost) .. ' ' .. fmt(a.tokens) .. ' ' .. fmt(a.steps) .. ' '
    .. table.concat(names, ' '))
  redis.call('ZADD', rz, fmt(now + a.rsv_ttl), a.id)
  redis.call('PEXPIRE', rh, a.chain_ttl)
  redis.call('PEXPIRE', rz, a.chain_ttl)
end
-- Whether reservation id is known to the pools already (held, reaped or settled).
local function pool_seen(K, ko, a)
  if a.id == '' then return false end
  return probe('HEXISTS', K[ko + a.np + 1], a.id) == 1 or probe('ZSCORE', K[ko + a.np + 3], a.id)
end
-- Settle reservation a.id in every pool: commit (c s t actual spend) or
-- release (commit = false). A settled id is remembered in ad (replays are
-- no-ops); without a record (lost with the store) a commit is applied as
-- spend. Returns how many pools were re-seeded.
local function pool_settle(K, ko, A, a, commit, now)
  local rh, rz, ad = K[ko + a.np + 1], K[ko + a.np + 2], K[ko + a.np + 3]
  if probe('ZSCORE', ad, a.id) then return 0 end
  local rec = probe('HGET', rh, a.id)
  local held, charge = nil, nil
  if rec then
    local p = words(rec)
    if #p < 4 then fail(rh, a.id, rec) end
    if p[1] == 'C' then
      if #p < 6 then fail(rh, a.id, rec) end
      charge = {count(rh, a.id, p[2]), count(rh, a.id, p[3]), count(rh, a.id, p[4]),
        count(rh, a.id, p[5])}
    else
      held = {count(rh, a.id, p[1]), count(rh, a.id, p[2]), count(rh, a.id, p[3])}
    end
  end
  local reseeded = 0
  for j = 1, a.np do
    local key, p = K[ko + j], pool_of(A, a, j)
    local st = pool_state(key)
    reseeded = reseeded + pool_sync(key, st, p.me, p.mc, p.ms, p.mt, now, a.fresh)
    pool_slide(key, st, now, p.wu, p.bu)
    if held then
      pool_total(key, st, 'rc', -held[1])
      pool_total(key, st, 'rt', -held[2])
      pool_total(key, st, 'rs', -held[3])
    elseif charge then
      pool_unspend(key, st, charge[4], charge[1], charge[3], charge[2])
    end
    if commit then pool_spend(key, st, now, a.cost, a.steps, a.tokens) end
    pool_touch(key, st, a.chain_ttl)
  end
  redis.call('HDEL', rh, a.id)
  redis.call('ZREM', rz, a.id)
  redis.call('ZADD', ad, fmt(now + a.aptl), a.id)
  redis.call('ZREMRANGEBYSCORE', ad, '-inf', fmt(now))
  local size = redis.call('ZCARD', ad)
  if size > a.cap then redis.call('ZREMRANGEBYRANK', ad, 0, size - a.cap - 1) end
  redis.call('PEXPIRE', ad, fmt(math.floor(a.aptl / 1000) + 1))
  return reseeded
end
