-- Helpers shared by every script.
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
