"""Lua sources of the shared ledger and breaker: each operation is one script.

Keys of one chain tree share a Redis Cluster hash tag, the id of the tree's
root chain (``root`` for ``root.1.2``), so a path's keys are in one slot::

    {prefix}{root}:c:{chain}   hash    the chain's counters (fields below)
    {prefix}{root}:s:{chain}   hash    signature -> times dispatched (repeat limit)
    {prefix}{root}:o:{chain}   zset    signature -> recency (least recent forgotten first)
    {prefix}{root}:rh          hash    reservation id -> "cost tokens chain..." or "R"
    {prefix}{root}:rz          zset    reservation id -> expiry (server time, microseconds)
    {prefix}breaker:{name}     hash    a circuit breaker (st, f, at, p, pe)

Chain hash fields: ``c`` committed nano-USD, ``rc`` reserved nano-USD, ``s``
steps, ``r`` retries, ``t`` tokens, ``rt`` reserved tokens, ``q`` signature
sequence, ``trip`` the sticky trip as JSON. Every value is a decimal integer
written by ``HINCRBY``; a script reads every field it will touch before it
writes anything (scripts are not rolled back), and a value that is not a
canonical integer, or a key of the wrong type, aborts the script with
``VERONICA_CORRUPT<TAB>key<TAB>field<TAB>value<TAB>`` instead of counting as 0.

Each reservation gets a record and an expiry; every ``RESERVE`` first gives
back (at most 64 of) the tree's expired reservations. Every write refreshes
the key's TTL (``PEXPIRE``). Time is the server's
``TIME``, so every process agrees on it.

Lua numbers are doubles, exact only below 2**53, so the client keeps every
sum a script computes below that: limits and the amounts of one reserve,
commit or override are at most :data:`STORE_MAX` (2**50: about 1.13 million
USD in nano-USD, 1.1e15 tokens; a larger cost ceiling counts as STORE_MAX,
which only denies earlier, and a larger amount as STORE_MAX + 1, which any
limited level refuses or trips on), and spent cost and tokens saturate at
2**51 in ``COMMIT``. A limited level then holds at most 2**51 reserved
(reserve admits only up to its limit, override included), so the largest
sum, committed + reserved + one amount, stays under 2**52 + 2**50 + 1.
Reserved amounts of an unlimited level are summed by ``HINCRBY`` alone
(exact in 64 bits) and never compared. Timestamps are microseconds of the
server clock plus a duration of at most 1e15 us.
"""

from __future__ import annotations

__all__ = [
    "STORE_MAX",
    "BREAKER",
    "CLEAR_TRIP",
    "COMMIT",
    "CORRUPT_TAG",
    "OVERRIDE",
    "RELEASE",
    "RESERVE",
    "TRIP",
]

CORRUPT_TAG = "VERONICA_CORRUPT"

# The largest limit or single amount a script is given (see the docstring);
# COMMIT saturates spent counters at 2 * STORE_MAX (its SATURATE).
STORE_MAX = 2**50

# Helpers shared by every script.
_PRELUDE = r"""
local function fail(key, field, value)
  local shown = string.gsub(string.sub(tostring(value), 1, 64), '%c', '?')
  error({err = 'VERONICA_CORRUPT\t' .. key .. '\t' .. field .. '\t' .. shown .. '\t'})
end
local function int(key, field, v)
  if v == false or v == nil then return 0 end
  if #v <= 19 and (v == '0' or string.find(v, '^%-?[1-9]%d*$')) then return tonumber(v) end
  fail(key, field, v)
end
local function count(key, field, v)
  if #v <= 19 and (v == '0' or string.find(v, '^[1-9]%d*$')) then return tonumber(v) end
  fail(key, field, v)
end
local function read(key, ...)
  local r = redis.pcall('HMGET', key, ...)
  if r.err then fail(key, '(type)', r.err) end
  return r
end
local function probe(cmd, key, ...)
  local r = redis.pcall(cmd, key, ...)
  if type(r) == 'table' and r.err then fail(key, '(type)', r.err) end
  return r
end
local function state(key)
  local v = read(key, 'trip', 'c', 'rc', 's', 'r', 't', 'rt', 'q', 'oe', 'oc', 'os')
  return {
    trip = v[1], c = int(key, 'c', v[2]), rc = int(key, 'rc', v[3]), s = int(key, 's', v[4]),
    r = int(key, 'r', v[5]), t = int(key, 't', v[6]), rt = int(key, 'rt', v[7]),
    q = int(key, 'q', v[8]), oe = int(key, 'oe', v[9]), oc = int(key, 'oc', v[10]),
    os = int(key, 'os', v[11]),
  }
end
local function fmt(n) return string.format('%d', n) end
local SATURATE = @SATURATE@
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function trip_json(reason, limit, observed, chain, message, now)
  return '{"reason":' .. cjson.encode(reason) .. ',"limit":' .. string.format('%.17g', limit)
    .. ',"observed":' .. string.format('%.17g', observed) .. ',"chain_id":' .. cjson.encode(chain)
    .. ',"message":' .. cjson.encode(message) .. ',"time":' .. string.format('%.6f', now / 1e6)
    .. '}'
end
local function limit_trip(reason, limit, observed, chain, now, soft)
  local unit = ''
  if reason == 'cost' then unit = ' USD' end
  local message = 'chain ' .. chain .. ': ' .. reason .. ' limit reached (limit '
    .. string.format('%g', limit) .. unit .. ', this call would make it '
    .. string.format('%g', observed) .. ')'
  if soft then
    message = message .. '; calls in flight hold the rest, try again once they finish'
  end
  return trip_json(reason, limit, observed, chain, message, now)
end
""".replace("@SATURATE@", str(2 * STORE_MAX))

# KEYS: chain hashes (n, root first), signature hashes (n), signature recency
#       zsets (n), the tree's reservation hash and expiry zset.
# ARGV: n cost tokens step retry signature id reservation_ttl_us chain_ttl_ms
#       marker_ttl_us signature_memory chain_key_base, then per level:
#       chain_id steps retries tokens cost_nano repeats (-1 = unlimited).
# Returns 1 (charged), {level, trip_json} (denied, the chain tripped; nothing
# charged) or {level, trip_json, 0}: a denial that only other calls' in-flight
# reservations cause (the call fits against committed spend alone), not stored.
RESERVE = (
    _PRELUDE
    + r"""
local n = tonumber(ARGV[1])
local cost, tokens = ARGV[2], ARGV[3]
local ncost, ntokens = tonumber(cost), tonumber(tokens)
local step, retry = ARGV[4] == '1', ARGV[5] == '1'
local sig, id = ARGV[6], ARGV[7]
local rsv_ttl, chain_ttl, marker_ttl = tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10])
local memory, base = tonumber(ARGV[11]), ARGV[12]
local rh, rz = KEYS[3 * n + 1], KEYS[3 * n + 2]
local now = now_us()

-- 1. Give back what expired reservations of this tree hold (their holder died
--    or hung); their steps stay counted, the call may have been sent. A reaped
--    reservation leaves a marker "R" so a late commit still adds its cost once.
probe('HLEN', rh)
local due = probe('ZRANGEBYSCORE', rz, '-inf', fmt(now), 'LIMIT', 0, 64)
for _, rid in ipairs(due) do
  local rec = probe('HGET', rh, rid)
  if rec == false or rec == 'R' then
    redis.call('ZREM', rz, rid)
    redis.call('HDEL', rh, rid)
  else
    local parts = {}
    for word in string.gmatch(rec, '%S+') do parts[#parts + 1] = word end
    if #parts < 3 then fail(rh, rid, rec) end
    count(rh, rid, parts[1])
    count(rh, rid, parts[2])
    local held = {}
    for j = 3, #parts do
      local key = base .. parts[j]
      state(key)
      if redis.call('EXISTS', key) == 1 then held[#held + 1] = key end
    end
    for _, key in ipairs(held) do
      if parts[1] ~= '0' then redis.call('HINCRBY', key, 'rc', '-' .. parts[1]) end
      if parts[2] ~= '0' then redis.call('HINCRBY', key, 'rt', '-' .. parts[2]) end
    end
    redis.call('HSET', rh, rid, 'R')
    redis.call('ZADD', rz, fmt(now + marker_ttl), rid)
  end
end

-- 2. Check every level, root first. The first sticky trip or new trip wins;
--    a denial caused only by in-flight reservations (soft) is not stored,
--    and any trip found on a later check or level still wins over it.
local sizes = {}
local soft = false
for i = 1, n do
  local key = KEYS[i]
  local st = state(key)
  if st.trip then return {i, st.trip} end
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
  if step and lsteps >= 0 and s + 1 > lsteps then
    denial = limit_trip('steps', lsteps, s + 1, chain, now)
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
    return {i, denial}
  end
  if held and not soft then soft = {i, held, 0} end
end
if soft then return soft end

-- 3. Charge every level, and record the reservation so it can expire.
local chains = {}
for i = 1, n do
  local key = KEYS[i]
  local a = 12 + (i - 1) * 6
  chains[i] = ARGV[a + 1]
  if step then redis.call('HINCRBY', key, 's', 1) end
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
  redis.call('HSET', rh, id, cost .. ' ' .. tokens .. ' ' .. table.concat(chains, ' '))
  redis.call('ZADD', rz, fmt(now + rsv_ttl), id)
  redis.call('PEXPIRE', rh, chain_ttl)
  redis.call('PEXPIRE', rz, chain_ttl)
end
return 1
"""
)

# Shared start of COMMIT and RELEASE: find the reservation. A settled one
# (no record) makes the script a no-op, so replaying a commit whose reply was
# lost never counts it twice; a reaped one ("R") holds nothing any more.
_SETTLE = r"""
local n = tonumber(ARGV[1])
local id, rcost, rtokens = ARGV[2], ARGV[3], ARGV[4]
local rh, rz = KEYS[n + 1], KEYS[n + 2]
local held = true
if id ~= '' then
  local rec = probe('HGET', rh, id)
  probe('ZSCORE', rz, id)
  if rec == false then return false end
  held = rec ~= 'R'
end
"""

# KEYS: chain hashes (n, root first), reservation hash, expiry zset.
# ARGV: n id reserved_cost reserved_tokens cost tokens chain_ttl_ms, then per
#       level: chain_id cost_nano_limit tokens_limit (-1 = unlimited).
# Returns nil, or {level, trip_json} for the first level the amounts overran.
COMMIT = (
    _PRELUDE
    + _SETTLE
    + r"""
local cost, tokens, chain_ttl = ARGV[5], ARGV[6], ARGV[7]
local states = {}
for i = 1, n do states[i] = state(KEYS[i]) end
if id ~= '' then
  redis.call('HDEL', rh, id)
  redis.call('ZREM', rz, id)
end
local over = tonumber(cost) > tonumber(rcost) or tonumber(tokens) > tonumber(rtokens)
local now = over and now_us() or 0
local first = false
for i = 1, n do
  local key = KEYS[i]
  if held then
    if rcost ~= '0' then redis.call('HINCRBY', key, 'rc', '-' .. rcost) end
    if rtokens ~= '0' then redis.call('HINCRBY', key, 'rt', '-' .. rtokens) end
  end
  -- Spent cost and tokens saturate at SATURATE, so every sum a script makes
  -- of them stays exact (see STORE_MAX in the module docstring).
  local c, t = states[i].c, states[i].t
  if cost ~= '0' then
    c = redis.call('HINCRBY', key, 'c', cost)
    if c > SATURATE then redis.call('HSET', key, 'c', fmt(SATURATE)) end
  end
  if tokens ~= '0' then
    t = redis.call('HINCRBY', key, 't', tokens)
    if t > SATURATE then redis.call('HSET', key, 't', fmt(SATURATE)) end
  end
  if over and not states[i].trip then
    local a = 7 + (i - 1) * 3
    local chain, lcost, ltokens = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    local trip = nil
    if lcost >= 0 and c > lcost then
      trip = limit_trip('cost', lcost / 1e9, c / 1e9, chain, now)
    elseif ltokens >= 0 and t > ltokens then
      trip = limit_trip('tokens', ltokens, t, chain, now)
    end
    if trip then
      redis.call('HSET', key, 'trip', trip)
      if not first then first = {i, trip} end
    end
  end
  redis.call('PEXPIRE', key, chain_ttl)
end
return first
"""
)

# KEYS: chain hashes (n, root first), reservation hash, expiry zset.
# ARGV: n id reserved_cost reserved_tokens step retry chain_ttl_ms.
RELEASE = (
    _PRELUDE
    + _SETTLE
    + r"""
local step, retry, chain_ttl = ARGV[5] == '1', ARGV[6] == '1', ARGV[7]
for i = 1, n do state(KEYS[i]) end
if id ~= '' then
  redis.call('HDEL', rh, id)
  redis.call('ZREM', rz, id)
end
for i = 1, n do
  local key = KEYS[i]
  if held then
    if rcost ~= '0' then redis.call('HINCRBY', key, 'rc', '-' .. rcost) end
    if rtokens ~= '0' then redis.call('HINCRBY', key, 'rt', '-' .. rtokens) end
  end
  if step then redis.call('HINCRBY', key, 's', -1) end
  if retry then redis.call('HINCRBY', key, 'r', -1) end
  redis.call('PEXPIRE', key, chain_ttl)
end
return false
"""
)

# KEYS: the chain hash. ARGV: trip_json chain_ttl_ms.
# Returns nil when this trip was stored, else the sticky one already there.
TRIP = (
    _PRELUDE
    + r"""
local v = read(KEYS[1], 'trip')
if v[1] then return v[1] end
redis.call('HSET', KEYS[1], 'trip', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return false
"""
)

# KEYS: the chain hash. ARGV: duration_us add_cost_nano add_steps chain_ttl_ms.
# Lifts the sticky trip and widens the ceilings until now + duration (server
# clock). Returns the lifted trip, or nil.
OVERRIDE = (
    _PRELUDE
    + r"""
local st = state(KEYS[1])
local now = now_us()
redis.call('HDEL', KEYS[1], 'trip')
redis.call('HSET', KEYS[1], 'oe', fmt(now + tonumber(ARGV[1])), 'oc', ARGV[2], 'os', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return st.trip
"""
)

# KEYS: the chain hash. Returns the removed trip, or nil.
CLEAR_TRIP = (
    _PRELUDE
    + r"""
local v = read(KEYS[1], 'trip')
if v[1] then redis.call('HDEL', KEYS[1], 'trip') end
return v[1]
"""
)

# KEYS: the breaker hash (st closed|open, f failures, at opened_at_us,
#       p probe token, pe probe expiry_us). HALF_OPEN is OPEN past the
#       recovery timeout; its single probe slot is the token in p.
# ARGV: op (check|success|failure|release|state) token any threshold
#       recovery_us probe_ttl_us key_ttl_ms.
# check -> {1, claimed_probe} or {0, state, failures, retry_in_us};
# state -> {state, failures}; others -> nil.
BREAKER = (
    _PRELUDE
    + r"""
local key = KEYS[1]
local op, token, any = ARGV[1], ARGV[2], ARGV[3] == '1'
local threshold, recovery, probe_ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local key_ttl = ARGV[7]
local v = read(key, 'st', 'f', 'at', 'p', 'pe')
local stored = v[1] or 'closed'
if stored ~= 'closed' and stored ~= 'open' then fail(key, 'st', stored) end
local failures, opened = int(key, 'f', v[2]), int(key, 'at', v[3])
local holder, expiry = v[4], int(key, 'pe', v[5])
local now = now_us()
local state = stored
if stored == 'open' and now - opened >= recovery then state = 'half_open' end
if op == 'state' then return {state, failures} end
if op == 'check' then
  if state == 'closed' then return {1, 0} end
  if state == 'half_open' and (holder == false or expiry <= now) then
    redis.call('HSET', key, 'p', token, 'pe', fmt(now + probe_ttl))
    redis.call('PEXPIRE', key, key_ttl)
    return {1, 1}
  end
  local wait = opened + recovery - now
  if wait < 0 then wait = 0 end
  return {0, state, failures, fmt(wait)}
end
if op == 'release' then
  if holder and (any or holder == token) then redis.call('HDEL', key, 'p', 'pe') end
  return false
end
-- success / failure: only CLOSED or the half-open probe's own outcome counts;
-- a late outcome of a call sent before the circuit opened changes nothing.
if state == 'open' then return false end
if state == 'half_open' and not (any or holder == token) then return false end
if op == 'success' then
  if stored == 'closed' and failures == 0 and not holder then return false end
  redis.call('HSET', key, 'st', 'closed', 'f', 0)
else
  failures = failures + 1
  if state == 'half_open' or failures >= threshold then
    redis.call('HSET', key, 'st', 'open', 'at', fmt(now))
  end
  redis.call('HSET', key, 'f', fmt(failures))
end
redis.call('HDEL', key, 'p', 'pe')
redis.call('PEXPIRE', key, key_ttl)
return false
"""
)
