-- KEYS: one pool hash. ARGV: clock_us ('' = TIME). Read-only: what its window holds now, without
-- dropping anything. Returns {c, s, t, rc, rs, rt, wu, free_us}: free_us is
-- when the oldest spend still in the window leaves it (-1: nothing will).
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
