"""Lua of budget pools in the shared ledger (see ``_pools.py`` for the protocol).

Keys (every pool key carries the one hash tag ``{:pools}``, which no chain
tree's tag can be, so all pools are in one Redis Cluster slot and one script
reserves in all of a call's pools)::

    {prefix}{:pools}:p:{name}  hash    one pool (fields below)
    {prefix}{:pools}:rh        hash    reservation id -> "cost tokens steps name...",
                                       or a reaped one's marker "C cost tokens steps at name..."
    {prefix}{:pools}:rz        zset    reservation id -> expiry (server time, us)
    {prefix}{:pools}:ad        zset    settled reservation id -> expiry (replay memory)

Pool hash fields: ``e`` epoch; ``c`` / ``s`` / ``t`` cost (nano-USD), steps
and tokens spent within the window (all time for a lifetime pool); ``rc`` /
``rs`` / ``rt`` reserved by calls in flight; ``wu`` / ``bu`` the window and
bucket length in microseconds (0: lifetime); ``lo`` the oldest bucket index
that may still hold spend; ``c:{i}`` / ``s:{i}`` / ``t:{i}`` the spend
committed in bucket ``i`` (server time ``[i * bu, (i + 1) * bu)``).

A bucket is dropped (its spend leaves ``c``/``s``/``t``) once all of it is
older than the window: when ``now >= (i + 1) * bu + wu``. Never earlier;
at most ``wu / bu + 2`` buckets are live, so memory is bounded. A pool's
key expires ``max(wu, ku) + bu + chain_ttl`` after its last write (never
under in-window spend); a lifetime pool's key, or one that ever was, never
expires. Time is the server's ``TIME``.

A window change (the same name with another ``wu`` / ``bu``) never drops
spend: what is held moves into the current bucket (it stays longer: denies
earlier, never later), and ``ku`` becomes the longest window the pool has
had (-1: it was a lifetime pool). While ``ku`` is longer than ``wu``, what
leaves the window goes into the lump ``pc`` / ``ps`` / ``pt`` (its newest
time ``pn``) instead of being dropped; the lump counts again when the window
grows back over it (``pn + wu > now``), in full when the pool becomes a
lifetime pool, and goes once ``pn + ku`` has passed.
"""

from __future__ import annotations

from ._scripts import _PRELUDE, COMMIT, RELEASE, RESERVE

__all__ = [
    "POOL_COMMIT",
    "POOL_HEARTBEAT",
    "POOL_RELEASE",
    "POOL_RESERVE",
    "POOL_SNAPSHOT",
    "POOLED_COMMIT",
    "POOLED_RELEASE",
    "POOLED_RESERVE",
    "RESERVE_CHECK",
    "SECTION",
]

# ARGV of a pool section (offset po): np id cost tokens steps base rsv_ttl_us
# marker_ttl_us applied_ttl_us applied_cap fresh chain_ttl_ms chain_id clock_us
# ('' = the server's TIME; a test's injected clock otherwise), then
# per pool: name wu bu cost_limit steps_limit tokens_limit (-1 unlimited) and
# the client's marks e c s t. KEYS (offset ko): np pool hashes, rh, rz, ad.
HEAD = 14
PER_POOL = 10
SECTION = (HEAD, PER_POOL)

_POOL_LIB = r"""
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
"""


def _wrapped(chain_script: str, extra: str = "") -> str:
    # The chain's own script, whole, as a function whose parameters shadow
    # KEYS and ARGV: it runs unchanged on its slice of the combined script's.
    return f"local function chain_op(KEYS, ARGV{extra})\n{chain_script}\nend\n"


def _checking(reserve: str) -> str:
    """The chain's RESERVE that, when ``check_only`` is true, stops after its
    checks (step 2: a sticky trip is stored, a soft denial returned) and
    charges nothing: ``{1, 0, '', reseeded, report...}`` when the call fits."""
    if reserve.count(_CHARGE) != 1:
        raise RuntimeError("RESERVE has no single '-- 3. Charge every level' step to stop before")
    stop = "\nif check_only then return report({1, 0, '', reseeded}, n) end"
    return reserve.replace(_CHARGE, stop + _CHARGE)


_CHARGE = "\n-- 3. Charge every level"
_RESERVE_OR_CHECK = _checking(RESERVE)

# The chain's verdict without charging it (Redis Cluster: asked after the
# pools denied in phase one, so the chain's own limits decide first, as in
# LocalLedger). KEYS and ARGV: RESERVE's; the reply: RESERVE's.
RESERVE_CHECK = "local check_only = true\n" + _RESERVE_OR_CHECK


# Combined scripts (one Redis or Valkey server): the chain's operation and
# the pools' in one atomic script. KEYS: the chain script's, then the pool
# section's. ARGV: section_length chain_key_count, the pool section, then
# the chain script's ARGV. Replies: the chain script's reply with each
# pool's report (e c s t) appended. When a pool denies, POOLED_RESERVE
# charges nothing and returns that denial {5, ...} (see pool_check) followed
# by the chain's own verdict (RESERVE's reply, checked only): the client
# reports the chain's denial first (PoolStore.first_denial).
_SPLIT = r"""
local np_args = tonumber(ARGV[1])
local nk = tonumber(ARGV[2])
local ko, po = nk, 2
local cargs = {unpack(ARGV, np_args + 3)}
local ckeys = {unpack(KEYS, 1, nk)}
local a = pool_args(ARGV, po)
"""

POOLED_RESERVE = (
    _PRELUDE
    + _POOL_LIB
    + _wrapped(_RESERVE_OR_CHECK, ", check_only")
    + _SPLIT
    + r"""
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
"""
)

_POOLED_SETTLE = r"""
local reply = chain_op(ckeys, cargs)
pool_settle(KEYS, ko, ARGV, a, @COMMIT@, pool_now(a))
return pool_report({unpack(KEYS, ko + 1, ko + a.np)}, a.np, reply)
"""

POOLED_COMMIT = (
    _PRELUDE + _POOL_LIB + _wrapped(COMMIT) + _SPLIT + _POOLED_SETTLE.replace("@COMMIT@", "true")
)
POOLED_RELEASE = (
    _PRELUDE + _POOL_LIB + _wrapped(RELEASE) + _SPLIT + _POOLED_SETTLE.replace("@COMMIT@", "false")
)

# Pool-only scripts (Redis Cluster: the pools' slot; see the two-phase
# protocol in _pools.py). KEYS: the pool section's. ARGV: the pool section,
# then four values the script ignores (the ledger's replay queue renews the
# fourth from last of every queued operation).
# POOL_RESERVE returns {1, 0, reseeded, report...} (held, or a duplicate: nothing
# held again) or a denial {5, ...}; POOL_COMMIT / POOL_RELEASE return
# {0, '', 0, report...} (the shape of a chain settlement's reply, no chain).
POOL_RESERVE = (
    _PRELUDE
    + _POOL_LIB
    + r"""
local a = pool_args(ARGV, 0)
local keys = {unpack(KEYS, 1, a.np)}
if pool_seen(KEYS, 0, a) then return pool_report(keys, a.np, {1, 0, 0}) end
local now = pool_now(a)
local denied = pool_check(KEYS, 0, ARGV, a, now)
if denied then return denied end
pool_hold(KEYS, 0, ARGV, a, now)
return pool_report(keys, a.np, {1, 0, 0})
"""
)

_POOL_SETTLE = r"""
local a = pool_args(ARGV, 0)
local reseeded = pool_settle(KEYS, 0, ARGV, a, @COMMIT@, pool_now(a))
return pool_report({unpack(KEYS, 1, a.np)}, a.np, {0, '', 0, reseeded})
"""
POOL_COMMIT = _PRELUDE + _POOL_LIB + _POOL_SETTLE.replace("@COMMIT@", "true")
POOL_RELEASE = _PRELUDE + _POOL_LIB + _POOL_SETTLE.replace("@COMMIT@", "false")

# KEYS: the pools' rh and rz. ARGV: reservation_ttl_us chain_ttl_ms id...
# Keeps each id whose record is still held alive until now + reservation_ttl.
POOL_HEARTBEAT = (
    _PRELUDE
    + r"""
local until_us = fmt(now_us() + tonumber(ARGV[1]))
local renewed = 0
for j = 3, #ARGV do
  local rec = probe('HGET', KEYS[1], ARGV[j])
  if rec and string.sub(rec, 1, 2) ~= 'C ' then
    probe('ZADD', KEYS[2], 'XX', until_us, ARGV[j])
    renewed = renewed + 1
  end
end
if renewed > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return renewed
"""
)

# KEYS: one pool hash. ARGV: clock_us ('' = TIME). Read-only: what its window holds now, without
# dropping anything. Returns {c, s, t, rc, rs, rt, wu, free_us}: free_us is
# when the oldest spend still in the window leaves it (-1: nothing will).
POOL_SNAPSHOT = (
    _PRELUDE
    + _POOL_LIB
    + r"""
local key = KEYS[1]
local st = pool_state(key)
local now = ARGV[1] ~= '' and tonumber(ARGV[1]) or now_us()
local c, s, t, free = st.c, st.s, st.t, -1
local last = st.wu > 0 and math.floor((now - st.wu) / st.bu) - 1 or 0
if st.wu > 0 and st.lo > 0 and last - st.lo > st.wu / st.bu + 2 then
  c, s, t = 0, 0, 0  -- all of it left the window (the next write drops it)
elseif st.wu > 0 and st.lo > 0 then
  for i = st.lo, math.floor(now / st.bu) do
    local names = {'c:' .. fmt(i), 's:' .. fmt(i), 't:' .. fmt(i)}
    local v = probe('HMGET', key, names[1], names[2], names[3])
    if v[1] or v[2] or v[3] then
      if i <= last then
        c = c - int(key, names[1], v[1])
        s = s - int(key, names[2], v[2])
        t = t - int(key, names[3], v[3])
      elseif free < 0 then
        free = (i + 1) * st.bu + st.wu - now
      end
    end
  end
end
return {fmt(math.max(c, 0)), fmt(math.max(s, 0)), fmt(math.max(t, 0)), fmt(st.rc), fmt(st.rs),
  fmt(st.rt), fmt(st.wu), fmt(free)}
"""
)
