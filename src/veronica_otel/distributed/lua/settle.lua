-- Shared by COMMIT and RELEASE: how a settlement id stands, and remembering it.
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
