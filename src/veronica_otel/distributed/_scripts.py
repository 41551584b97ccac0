"""Lua sources of the shared ledger and breaker: each operation is one script.

Keys of one chain tree share a Redis Cluster hash tag, the id of the tree's
root chain (``root`` for ``root.1.2``), so a path's keys are in one slot::

    {prefix}{root}:c:{chain}   hash    the chain's counters (fields below)
    {prefix}{root}:s:{chain}   hash    signature -> times dispatched (repeat limit)
    {prefix}{root}:o:{chain}   zset    signature -> recency (least recent forgotten first)
    {prefix}{root}:rh          hash    reservation id -> "cost tokens :k[r] chain...", or a
                                       reaped one's marker "C cost tokens :k[r]" ("R": older)
    {prefix}{root}:rz          zset    reservation id -> expiry (server time, microseconds)
    {prefix}{root}:ad          zset    "id@epoch..." of an applied settlement -> expiry
    {prefix}breaker:{name}     hash    a circuit breaker (st, f, at, p, pe)

Chain hash fields: ``c`` committed nano-USD, ``rc`` reserved nano-USD, ``s``
steps, ``r`` retries, ``t`` tokens, ``rt`` reserved tokens, ``q`` signature
sequence, ``trip`` the sticky trip as JSON, ``oe``/``oc``/``os`` a logged
override (expiry, extra cost, extra steps), ``ov`` override generation
(+1 per override or cleared trip), ``e`` the chain's epoch, ``l`` its
*lineage* (below), ``gh`` its ghost reservation's id, ``k`` / ``kt`` the cost
and tokens late settlements of charged reservations gave back (so ``c + k``
and ``t + kt`` never fall within an epoch). Every counter is a
decimal integer written by ``HINCRBY``; a script reads every field it will
touch before it writes anything (scripts are not rolled back), and a value
that is not a canonical integer, or a key of the wrong type, aborts the
script with ``VERONICA_CORRUPT<TAB>key<TAB>field<TAB>value<TAB>`` instead of
counting as 0.

The store never forgets (protocol)
----------------------------------
*Epoch.* Each chain hash carries ``e``, an opaque id written when the chain
is created (by the first script that finds no ``e``; the client proposes a
fresh id with every call, ARGV ``fresh``). A chain that is deleted, flushed,
expired, evicted or lost in a restart comes back with another epoch.

*Marks.* After every script a client keeps, per chain, what the store said
(the script's *report*): ``(e, c, s, t, ov, trip, rc, rt, l)`` as text
(MARKS values), ``trip`` and ``l`` empty when none. ``c + k`` and ``t + kt`` only grow within an
epoch (``c`` and ``t`` fall only when a late settlement replaces a reaper's
charge), so a mark is a high-water mark of them. Every chain-writing script
(RESERVE, COMMIT, RELEASE, TRIP, OVERRIDE) is given the caller's marks of
each level (MARKS ARGV per level, ``""`` / ``0`` for a chain it never saw)
and first runs ``sync`` on each level:

* no marks (epoch ``""``): a chain without ``e`` gets ``e = fresh``; else as is.
* marks of the current epoch, ``c + k >= mark c``, ``t + kt >= mark t`` and, if the
  mark holds a trip, the store still has one or ``ov > mark ov`` (an
  override lifted it): nothing to do.
* marks of an older epoch whose every part the lineage already holds
  (below): nothing to do.
* otherwise the store lost what this client saw (*re-seed*), below.

*Lineage.* Field ``l`` lists, per epoch this chain absorbed from marks (a
lost one, or its ancestors), ``epoch c s t rc rt``: that epoch's *own*
counters (spend made in it, not what it absorbed) as far as any client's
marks showed them, and what was re-held of its reservations. A chain's
counters are its own epoch's spend plus the sum of its lineage, and a mark
``(e, c, s, t, l)`` knows, epoch by epoch, ``l``'s parts and its own epoch's
``c - sum(l.c)`` (and s, t). A re-seed merges what the marks know into the
lineage, part by part, taking the max and adding to the counters only what
grows, like a grow-only counter whose replicas are epochs: each client's
marks count once, a chain lost twice never counts its first epoch again (the
second epoch's marks carry the first in their lineage), and the merge order
does not matter. A chain the store still has under the marks' epoch but
with less (a rolled-back copy) has what it holds absorbed as that epoch's
part, and gets a new epoch, so every client of the old one re-checks. The
lineage keeps its newest LINEAGE_MAX epochs; marks of an older one are
counted again (only ever more). What the marks saw reserved beyond what was
re-held for their epoch (rc, rt: calls in flight at
  the loss, whose records are gone) is held again by a *ghost reservation*
  (record ``g{fresh}.{chain}`` = "rc rt chain", expiry now +
  reservation_ttl; RESERVE, COMMIT and RELEASE only; chain field ``gh``
  names it; a second loss adds to the same ghost), which the reaper gives
  back like any expired reservation. The
  calls' commits and releases arrive without a record: each takes its own
  reserved amounts out of the ghost (``unghost``: at most what it holds;
  gone at zero), and a commit is applied as spend. So the first
  client of a lost epoch restores its marks, and each later client of the
  same epoch adds only what it saw beyond them: counted once, exactly what
  the highest mark saw; spend made in the new epoch is kept on top. A trip
  in the marks is stored again if the chain has none. ``e`` becomes
  ``fresh`` when the chain had none (or was rolled back). c and t saturate
  at SATURATE. Re-seeding never lowers a counter and never lifts a trip;
  what it can overcount (a release or override the client did not see) only
  denies earlier.

In RESERVE, ``on_loss = fail`` (ARGV) makes a loss return code 4 without
writing anything; the client raises ``LedgerLostError``. Settlements always
re-seed: a call that ran is always counted.

*Commit ids.* Every COMMIT and RELEASE carries an id: its reservation's, or
a fresh one for a commit without a reservation. ``ad`` remembers an applied
id with the epochs its levels had then (``id@e1@e2...``), so a replay finds
it only while every chain it counted in is still the same epoch: an id found
there is a replay, the script does nothing and only reports; a replay whose
chain was lost since (its reply was lost, then the store lost the chain:
``ad`` may outlive an expired chain) is counted again, never dropped.
Otherwise a reservation record ``held`` is settled normally (RELEASE gives
back the record's amounts and steps); a marker ``C cost tokens`` (reaped and
charged, below) has the charge replaced: COMMIT adds ``actual - charged`` to
c and t (limits checked), RELEASE (never sent) takes the charge back and the
steps; what either takes back is added to ``k`` / ``kt``. A marker ``R`` (an
older version's reap, which gave cost and tokens back) or no record at all
(lost with the store, or its holder outlived the marker) is applied as spend
(COMMIT: cost and tokens added, the limits checked as for an overrun) or
keeps its step (RELEASE without a record: the step may have been re-seeded).
A reserve whose reply never came (store error) is cancelled by a queued
RELEASE of its id with amounts 0: it gives back what the record holds, or
nothing if the reserve never arrived. The id then goes into ``ad`` with
expiry now + ``applied_ttl`` (ARGV); expired ids are removed on every
settlement and ``ad`` holds at most ``applied_cap`` ids (soonest-expiring
dropped first), so memory stays bounded. A replay after its id was dropped
counts twice: never less.

*Reservations.* Each reservation gets a record and an expiry. The record
holds its cost, tokens, chains and ``:k`` (``:kr`` with a retry): the steps
it counted (a grant's carve reserves k at once), so a RELEASE gives back k
and a COMMIT's unused steps are at most k, whatever the settlement names;
a reaped record's marker keeps ``:k`` (records without it, from an older
version, use the settlement's count). RESERVE is
idempotent: a reserve whose id already has a record (held or a marker) or is
in ``ad`` (settled or cancelled) changes nothing and reports code 1, so a
retried or duplicated request never holds twice. Every ``RESERVE`` first
*charges* (at most 64 of) the tree's expired reservations (fail closed: the
holder died or hung, its call may have been sent): cost and tokens move from
``rc``/``rt`` to ``c``/``t`` (saturating), the step stays counted, and the
record becomes the marker ``C cost tokens`` until ``marker_ttl`` (ARGV; the
client passes the applied-id TTL, 1 day), after which it is dropped and a
later commit counts on top of the charge (an overcount). A reaped ghost
reservation (id ``g...``) is given back instead: its calls' settlements
arrive without a record and are applied as spend.

A live client keeps its running calls' reservations alive
with HEARTBEAT (every reservation_ttl / 3 seconds: expiry = now +
reservation_ttl for each of its ids that still has a held record, and the
chain keys of that record refreshed for chain_ttl), so only a dead or frozen
holder's reservation is reaped (charged), and no chain key expires under a
running call. A charge is committed spend: a denial it causes is sticky.

*Expiry.* Every write refreshes the key's TTL (``PEXPIRE`` chain_ttl,
1 day by default): a chain is forgotten only after that long without any
write, and if a client that ran it is still alive, its marks bring it back.

*What no client can know* (the guarantee after a loss; the simulation,
``tests/simulation/_sim_ledger.py``, checks exactly this). A store without
persistence that loses a chain keeps only what clients' marks hold, and a
mark is what its client last heard. So:

1. Never lost, never twice: spend, steps and trips in any mark of a client
   that touches the chain again come back, each counted once across every
   client and every later loss (lineage); a settlement in flight at the loss
   is applied once (its record is gone: applied as spend, its reservation
   taken from the ghost).
2. Lost: what only the store and clients that never come back (crashed)
   saw: spend committed after every surviving client's last reply, and
   calls in flight whose holder died (their ghost share is given back at
   expiry: the ghost also holds reservations the marks saw that settled
   before the loss, so charging it would overcount on every lagging mark).
3. Counted twice, at most: a settlement whose reply was lost and that the
   store applied before the loss, if a mark saw it (the replay cannot know):
   at most its reservation; and a reaper's charge that a late commit had
   replaced before the loss, re-seeded from a mark taken between the two (at
   most ``k``; marks carrying ``k`` would close it).
4. Admitted past a ceiling or a trip: until the client that saw the latest
   state touches the chain again, a client with older marks, or a new one
   with none, cannot see that state: calls may be admitted beyond it, at
   most by what the lost chain held (committed + reserved). A client never
   admits past its OWN marks: a re-seed never lowers a counter it saw and
   never lifts a trip it saw (only ``override`` does). ``on_loss="fail"``
   denies such a client instead; a client without marks cannot tell a lost
   chain from a new one. Persistence (``appendonly yes``, ``noeviction``)
   is the only way to close 2-4.

Also (safe direction, denies earlier): a chain restored from an older copy
with the same epoch that lost at most the ``k`` the marks saw goes
undetected; a reservation record lost without its chain hash (``rh``
evicted alone) leaves its ``rc``/``rt`` held on the chain; a ghost holds
marks' reservations that settled elsewhere until it expires; a replay whose
id left ``ad`` overcounts.

Replies: every chain-writing script ends with the report of each level,
MARKS values per level (``e c s t ov trip rc rt l``), after its own fields.

Time is the server's ``TIME``, so every process agrees on it.

Lua numbers are doubles, exact only below 2**53, so the client keeps every
sum a script computes below that: limits and the amounts of one reserve,
commit or override are at most :data:`STORE_MAX` (2**50: about 1.13 million
USD in nano-USD, 1.1e15 tokens; a larger cost ceiling counts as STORE_MAX,
which only denies earlier, and a larger amount as STORE_MAX + 1, which any
limited level refuses or trips on), and spent cost and tokens saturate at
2**51 in ``COMMIT`` and in a re-seed (marks are values the store reported,
so at most 2**51; a re-seed adds at most that to at most 2**51 and then
saturates). A limited level then holds at most 2**51 reserved (reserve
admits only up to its limit, override included), so the largest sum,
committed + reserved + one amount, stays under 2**52 + 2**50 + 1.
A reaper's charge moves one reserved amount to spent and saturates like
COMMIT; a late settlement adds ``actual - charged``, the difference of two
amounts (each at most STORE_MAX + 1), never below 0; ``k``/``kt``
saturate at 2**51 too, so ``c + k`` stays under 2**52. Reserved
amounts of an unlimited level are summed by ``HINCRBY`` alone (exact in 64
bits) and never compared. Steps only grow by one per call. Timestamps are
microseconds of the server clock plus a duration of at most 1e15 us.
"""

from __future__ import annotations

__all__ = [
    "STORE_MAX",
    "BREAKER",
    "CLEAR_TRIP",
    "COMMIT",
    "CORRUPT_TAG",
    "HEARTBEAT",
    "MARKS",
    "OVERRIDE",
    "RELEASE",
    "RESERVE",
    "TRIP",
]

CORRUPT_TAG = "VERONICA_CORRUPT"

# The largest limit or single amount a script is given (see the docstring);
# COMMIT saturates spent counters at 2 * STORE_MAX (its SATURATE).
STORE_MAX = 2**50

# Values per level in a script's report and in a client's marks.
MARKS = 9

# Lost epochs a chain's lineage remembers (see "Lineage").
LINEAGE_MAX = 16

# Helpers shared by every script.
_PRELUDE = (
    r"""
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
  local v = read(key, 'trip', 'c', 'rc', 's', 'r', 't', 'rt', 'q', 'oe', 'oc', 'os', 'ov', 'e',
    'k', 'kt', 'l')
  return {
    trip = v[1], c = int(key, 'c', v[2]), rc = int(key, 'rc', v[3]), s = int(key, 's', v[4]),
    r = int(key, 'r', v[5]), t = int(key, 't', v[6]), rt = int(key, 'rt', v[7]),
    q = int(key, 'q', v[8]), oe = int(key, 'oe', v[9]), oc = int(key, 'oc', v[10]),
    os = int(key, 'os', v[11]), ov = int(key, 'ov', v[12]), e = v[13],
    k = int(key, 'k', v[14]), kt = int(key, 'kt', v[15]), l = v[16] or '',
  }
end
local function fmt(n) return string.format('%d', n) end
local SATURATE = @SATURATE@
local M = @MARKS@
local LINEAGE_MAX = @LINEAGE_MAX@
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
-- A client's marks of one chain, ARGV[a + 1 .. a + M]: e c s t ov trip rc rt l.
-- (Values the store reported to our own client: read, not re-validated.)
local function marks(a)
  return {
    e = ARGV[a + 1], c = tonumber(ARGV[a + 2]), s = tonumber(ARGV[a + 3]),
    t = tonumber(ARGV[a + 4]), o = tonumber(ARGV[a + 5]), trip = ARGV[a + 6],
    rc = tonumber(ARGV[a + 7]), rt = tonumber(ARGV[a + 8]), l = ARGV[a + 9],
  }
end
-- A lineage "epoch c s t rc rt ..." (field l; see "Lineage" in _scripts.py):
-- returns the epochs in order and epoch -> {c, s t, rc, rt}. num reads a
-- number (count on the store's own field, tonumber on a client's marks).
local function lineage(text, num)
  local order, at, w = {}, {}, {}
  if not text or text == '' then return order, at end
  for word in string.gmatch(text, '%S+') do w[#w + 1] = word end
  if #w % 6 ~= 0 then num('(lineage)') end
  for j = 1, #w - 5, 6 do
    if not at[w[j]] then order[#order + 1] = w[j] end
    at[w[j]] = {num(w[j + 1]), num(w[j + 2]), num(w[j + 3]), num(w[j + 4]), num(w[j + 5])}
  end
  return order, at
end
local function stored_lineage(key, st)
  return lineage(st.l, function(v) return count(key, 'l', v) end)
end
local function marks_lineage(m)
  return lineage(m.l, function(v) return tonumber(v) or 0 end)
end
-- What marks m know, epoch by epoch: {epoch, c, s, t, rc, rt} for each
-- epoch their chain had absorbed, then their own epoch's own part (its
-- counters less what it absorbed) with what was reserved when they were taken.
local function known(m)
  local order, at = marks_lineage(m)
  local out, c, s, t = {}, 0, 0, 0
  for _, e in ipairs(order) do
    local v = at[e]
    out[#out + 1] = {e, v[1], v[2], v[3], 0, 0}
    c, s, t = c + v[1], s + v[2], t + v[3]
  end
  out[#out + 1] = {m.e, math.max(0, m.c - c), math.max(0, m.s - s), math.max(0, m.t - t),
    m.rc, m.rt}
  return out
end
-- Whether the store lost what marks m saw of the chain in state st.
local function lost(key, st, m)
  if m.e == '' then return false end
  local trip_kept = m.trip == '' or st.trip
  if st.e == m.e then
    -- c + k and t + kt only grow within an epoch (k, kt: what late settlements
    -- of charged reservations gave back), so c and t may fall below a mark.
    return not (st.c + st.k >= m.c and st.t + st.kt >= m.t and (trip_kept or st.ov > m.o))
  end
  -- Marks of an older epoch this chain already absorbed whole: nothing lost.
  if not st.e or st.l == '' or not trip_kept then return true end
  local _, at = stored_lineage(key, st)
  for _, x in ipairs(known(m)) do
    local b = at[x[1]]
    if not b or x[2] > b[1] or x[3] > b[2] or x[4] > b[3] then return true end
  end
  return false
end
-- Bring the chain at key in line with marks m (see "The store never
-- forgets" in _scripts.py). Returns 1 when it re-seeded, else 0. With the
-- tree's reservation keys (rsv = {rh, rz, now, ttl_us}), what the marks saw
-- reserved is held again by a ghost reservation that expires after ttl_us.
local function sync(key, st, m, fresh, chain_ttl, rsv)
  if not lost(key, st, m) then
    if not st.e then
      redis.call('HSET', key, 'e', fresh)
      redis.call('PEXPIRE', key, chain_ttl)
    end
    return 0
  end
  local order, at = stored_lineage(key, st)
  local epoch = st.e
  if epoch == m.e then
    -- An older copy of the marks' epoch (a rollback): what it holds of that
    -- epoch is absorbed as is, and the chain gets a new epoch.
    local c, s, t = st.c, st.s, st.t
    for _, e in ipairs(order) do c, s, t = c - at[e][1], s - at[e][2], t - at[e][3] end
    if not at[epoch] then order[#order + 1] = epoch end
    at[epoch] = {math.max(0, c), math.max(0, s), math.max(0, t), st.rc, st.rt}
    epoch = false
  end
  local names, gc, gt = {'c', 's', 't'}, 0, 0
  for _, x in ipairs(known(m)) do
    local b = at[x[1]]
    if not b then
      b = {0, 0, 0, 0, 0}
      at[x[1]] = b
      order[#order + 1] = x[1]
    end
    for j = 1, 3 do
      if x[j + 1] > b[j] then
        local v = redis.call('HINCRBY', key, names[j], fmt(x[j + 1] - b[j]))
        if j ~= 2 and v > SATURATE then redis.call('HSET', key, names[j], fmt(SATURATE)) end
        b[j] = x[j + 1]
      end
    end
    if x[1] == m.e then
      gc, gt = math.max(0, x[5] - b[4]), math.max(0, x[6] - b[5])
      b[4], b[5] = b[4] + gc, b[5] + gt
    end
  end
  -- Calls in flight when the store lost the chain: hold what was reserved
  -- again, for one reservation TTL (their commits arrive without a record),
  -- in the chain's ghost reservation (one per chain: a second loss adds to it).
  local at_c = string.find(key, '}:c:', 1, true)
  if rsv and at_c and (gc > 0 or gt > 0) then
    local chain = string.sub(key, at_c + 4)
    local gid = probe('HGET', key, 'gh')
    local rec = gid and probe('HGET', rsv[1], gid)
    if rec and rec ~= 'R' and string.sub(rec, 1, 2) ~= 'C ' then
      local parts = {}
      for word in string.gmatch(rec, '%S+') do parts[#parts + 1] = word end
      if #parts ~= 3 then fail(rsv[1], gid, rec) end
      rec = fmt(count(rsv[1], gid, parts[1]) + gc) .. ' ' .. fmt(count(rsv[1], gid, parts[2]) + gt)
    else
      gid = 'g' .. fresh .. '.' .. chain
      rec = fmt(gc) .. ' ' .. fmt(gt)
    end
    redis.call('HSET', rsv[1], gid, rec .. ' ' .. chain)
    redis.call('ZADD', rsv[2], fmt(rsv[3] + rsv[4]), gid)
    redis.call('PEXPIRE', rsv[1], chain_ttl)
    redis.call('PEXPIRE', rsv[2], chain_ttl)
    if gc > 0 then redis.call('HINCRBY', key, 'rc', fmt(gc)) end
    if gt > 0 then redis.call('HINCRBY', key, 'rt', fmt(gt)) end
    redis.call('HSET', key, 'gh', gid)
  end
  -- The lineage keeps its newest LINEAGE_MAX epochs (an older one's marks
  -- would be counted again: only ever more).
  local words = {}
  for j = math.max(1, #order - LINEAGE_MAX + 1), #order do
    local b = at[order[j]]
    words[#words + 1] = order[j] .. ' ' .. fmt(b[1]) .. ' ' .. fmt(b[2]) .. ' ' .. fmt(b[3])
      .. ' ' .. fmt(b[4]) .. ' ' .. fmt(b[5])
  end
  redis.call('HSET', key, 'l', table.concat(words, ' '))
  if not epoch then redis.call('HSET', key, 'e', fresh) end
  if m.trip ~= '' and not st.trip then redis.call('HSET', key, 'trip', m.trip) end
  redis.call('PEXPIRE', key, chain_ttl)
  return 1
end
-- Move spent counter `field` of key by delta (an actual amount minus what a
-- reap charged): saturates at SATURATE, never below 0, and what it gives
-- back is added to `back` (k or kt), so field + back never falls.
local function respend(key, field, back, delta)
  if delta == 0 then return end
  local v = redis.call('HINCRBY', key, field, fmt(delta))
  if v > SATURATE then redis.call('HSET', key, field, fmt(SATURATE)) end
  if v < 0 then
    redis.call('HSET', key, field, '0')
    delta = delta - v
  end
  if delta < 0 then
    local b = redis.call('HINCRBY', key, back, fmt(-delta))
    if b > SATURATE then redis.call('HSET', key, back, fmt(SATURATE)) end
  end
end
-- A settlement without a record (its call was in flight at a loss) takes
-- its reserved amounts out of the chain's ghost reservation, if one holds them.
local function unghost(key, rh, rz, rcost, rtokens)
  local gid = probe('HGET', key, 'gh')
  if not gid then return end
  local rec = probe('HGET', rh, gid)
  if rec == false or rec == 'R' then
    redis.call('HDEL', key, 'gh')
    return
  end
  local parts = {}
  for word in string.gmatch(rec, '%S+') do parts[#parts + 1] = word end
  if #parts ~= 3 then fail(rh, gid, rec) end
  local gc, gt = count(rh, gid, parts[1]), count(rh, gid, parts[2])
  local dc, dt = math.min(gc, rcost), math.min(gt, rtokens)
  if dc > 0 then redis.call('HINCRBY', key, 'rc', fmt(-dc)) end
  if dt > 0 then redis.call('HINCRBY', key, 'rt', fmt(-dt)) end
  gc, gt = gc - dc, gt - dt
  if gc == 0 and gt == 0 then
    redis.call('HDEL', rh, gid)
    redis.call('ZREM', rz, gid)
    redis.call('HDEL', key, 'gh')
  else
    redis.call('HSET', rh, gid, fmt(gc) .. ' ' .. fmt(gt) .. ' ' .. parts[3])
  end
end
-- The charged amounts of a reaped reservation's marker "C cost tokens".
local function charged(rh, id, rec)
  local parts = {}
  for word in string.gmatch(rec, '%S+') do parts[#parts + 1] = word end
  if #parts ~= 3 and #parts ~= 4 then fail(rh, id, rec) end
  return count(rh, id, parts[2]), count(rh, id, parts[3]), parts[4]
end
-- A record's steps word ":k" (":kr" with a retry): how many steps and whether
-- a retry the reservation holds; nil for a record without one (older).
local function held_steps(rh, id, word)
  if not word or string.sub(word, 1, 1) ~= ':' then return nil end
  local k, r = string.match(word, '^:(%d+)(r?)$')
  if not k then fail(rh, id, word) end
  return tonumber(k), r == 'r'
end
-- An applied id is remembered with the epochs of its chains (``applied_as``):
-- counted in a chain the store lost since, it is counted again (never less).
local function applied_as(id, n)
  local tag = {id}
  for i = 1, n do tag[i + 1] = probe('HGET', KEYS[i], 'e') or '' end
  return table.concat(tag, '@')
end
-- Append the report of KEYS[1..n] (e c s t ov trip rc rt per level) to out.
local function report(out, n)
  for i = 1, n do
    local v = redis.call('HMGET', KEYS[i], 'e', 'c', 's', 't', 'ov', 'trip', 'rc', 'rt', 'l')
    out[#out + 1] = v[1] or ''
    out[#out + 1] = v[2] or '0'
    out[#out + 1] = v[3] or '0'
    out[#out + 1] = v[4] or '0'
    out[#out + 1] = v[5] or '0'
    out[#out + 1] = v[6] or ''
    out[#out + 1] = v[7] or '0'
    out[#out + 1] = v[8] or '0'
    out[#out + 1] = v[9] or ''
  end
  return out
end
""".replace("@SATURATE@", str(2 * STORE_MAX))
    .replace("@MARKS@", str(MARKS))
    .replace("@LINEAGE_MAX@", str(LINEAGE_MAX))
)

# Shared by COMMIT and RELEASE: how a settlement id stands, and remembering it.
_SETTLE = r"""
-- 'done' (applied before: a replay), 'held', 'charged' (reaped: its
-- reservation is counted as spent; also returns what was charged), 'reaped'
-- (an older marker "R": given back) or 'none' (no record).
local function standing(rh, rz, ad, id, n)
  probe('ZSCORE', rz, id)
  if probe('ZSCORE', ad, applied_as(id, n)) then return 'done' end
  local rec = probe('HGET', rh, id)
  if rec == false then return 'none' end
  if rec == 'R' then return 'reaped' end
  if string.sub(rec, 1, 2) == 'C ' then return 'charged', charged(rh, id, rec) end
  local parts = {}
  for word in string.gmatch(rec, '%S+') do parts[#parts + 1] = word end
  if #parts < 3 then fail(rh, id, rec) end
  return 'held', count(rh, id, parts[1]), count(rh, id, parts[2]), parts[3]
end
local function applied(rh, rz, ad, id, n, now, ttl, cap)
  redis.call('HDEL', rh, id)
  redis.call('ZREM', rz, id)
  redis.call('ZADD', ad, fmt(now + ttl), applied_as(id, n))
  redis.call('ZREMRANGEBYSCORE', ad, '-inf', fmt(now))
  local size = redis.call('ZCARD', ad)
  if size > cap then redis.call('ZREMRANGEBYRANK', ad, 0, size - cap - 1) end
  redis.call('PEXPIRE', ad, fmt(math.floor(ttl / 1000) + 1))
end
"""

# KEYS: chain hashes (n, root first), signature hashes (n), signature recency
#       zsets (n), the tree's reservation hash, expiry zset and applied zset.
# ARGV: n cost tokens steps retry signature id reservation_ttl_us chain_ttl_ms
#       marker_ttl_us signature_memory chain_key_base, then per level:
#       chain_id steps retries tokens cost_nano repeats (-1 = unlimited), then
#       per level the client's marks (8), then fresh_epoch on_loss(reseed|fail).
# Returns {code, level, trip, reseeded, report...}: code 1 charged (or this id
# was reserved or settled before: nothing charged again); 2 denied,
# the chain tripped (nothing charged); 3 a denial that only other calls'
# in-flight reservations cause (the call fits against committed spend
# alone), not stored; 4 the store lost level's chain and on_loss is fail
# (nothing written).
RESERVE = (
    _PRELUDE
    + r"""
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
"""
)

# KEYS: chain hashes (n, root first), reservation hash, expiry zset, applied zset.
# ARGV: n id reserved_cost reserved_tokens cost tokens chain_ttl_ms
#       release_steps (of the reservation's steps, given back: a carve's unused
#       ones), then per
#       level: chain_id cost_nano_limit tokens_limit (-1 = unlimited), then per
#       level the client's marks (8), then fresh_epoch applied_ttl_us applied_cap
#       reservation_ttl_us.
# Returns {level, trip, reseeded, report...}: level 0 and trip '' unless the
# amounts overran a level (the first one is returned).
COMMIT = (
    _PRELUDE
    + _SETTLE
    + r"""
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
"""
)

# KEYS: chain hashes (n, root first), reservation hash, expiry zset, applied zset.
# ARGV: n id reserved_cost reserved_tokens steps retry chain_ttl_ms, then per
#       level the client's marks (8), then fresh_epoch applied_ttl_us applied_cap
#       reservation_ttl_us.
# Returns {0, '', reseeded, report...}.
RELEASE = (
    _PRELUDE
    + _SETTLE
    + r"""
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
"""
)

# KEYS: the chain hash. ARGV: trip_json chain_ttl_ms, the client's marks (8),
# fresh_epoch. Returns {sticky, reseeded, report...}: sticky is '' when this
# trip was stored, else the sticky one already there.
TRIP = (
    _PRELUDE
    + r"""
local key = KEYS[1]
local st = state(key)
local reseeded = sync(key, st, marks(2), ARGV[3 + M], ARGV[2])
local v = read(key, 'trip')
if v[1] then return report({v[1], reseeded}, 1) end
redis.call('HSET', key, 'trip', ARGV[1])
redis.call('PEXPIRE', key, ARGV[2])
return report({'', reseeded}, 1)
"""
)

# KEYS: the chain hash. ARGV: duration_us add_cost_nano add_steps chain_ttl_ms,
# the client's marks (8), fresh_epoch.
# Lifts the sticky trip and widens the ceilings until now + duration (server
# clock); ov + 1 tells every client the lift was an override. Returns
# {lifted_trip or '', reseeded, report...}, or {'-'} when the chain does not
# exist and the client has no marks of it (nothing to override).
OVERRIDE = (
    _PRELUDE
    + r"""
local key = KEYS[1]
local st = state(key)
local m = marks(4)
if m.e == '' and redis.call('EXISTS', key) == 0 then return {'-'} end
local reseeded = sync(key, st, m, ARGV[5 + M], ARGV[4])
local trip = read(key, 'trip')[1]
local now = now_us()
redis.call('HDEL', key, 'trip')
redis.call('HSET', key, 'oe', fmt(now + tonumber(ARGV[1])), 'oc', ARGV[2], 'os', ARGV[3])
redis.call('HINCRBY', key, 'ov', 1)
redis.call('PEXPIRE', key, ARGV[4])
return report({trip or '', reseeded}, 1)
"""
)

# KEYS: the chain hash. Returns the removed trip, or nil (ov + 1 if removed).
CLEAR_TRIP = (
    _PRELUDE
    + r"""
local st = state(KEYS[1])
if st.trip then
  redis.call('HDEL', KEYS[1], 'trip')
  redis.call('HINCRBY', KEYS[1], 'ov', 1)
end
return st.trip
"""
)

# KEYS: the tree's reservation hash and expiry zset. ARGV: reservation_ttl_us
# chain_ttl_ms chain_key_base id... Keeps each id whose record is still held
# alive until now + reservation_ttl, and the keys of its chains for chain_ttl.
# Returns how many were renewed.
HEARTBEAT = (
    _PRELUDE
    + r"""
local rh, rz, base = KEYS[1], KEYS[2], ARGV[3]
local until_us = fmt(now_us() + tonumber(ARGV[1]))
local renewed = 0
for j = 4, #ARGV do
  local rec = probe('HGET', rh, ARGV[j])
  if rec and rec ~= 'R' and string.sub(rec, 1, 2) ~= 'C ' then
    probe('ZADD', rz, 'XX', until_us, ARGV[j])
    local k = 0
    for word in string.gmatch(rec, '%S+') do
      k = k + 1
      if k > 2 and string.sub(word, 1, 1) ~= ':' then
        redis.call('PEXPIRE', base .. word, ARGV[2])
      end
    end
    renewed = renewed + 1
  end
end
if renewed > 0 then
  redis.call('PEXPIRE', rh, ARGV[2])
  redis.call('PEXPIRE', rz, ARGV[2])
end
return renewed
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
