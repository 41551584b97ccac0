-- KEYS: the chain hash. Returns the removed trip, or nil (ov + 1 if removed).
local st = state(KEYS[1])
if st.trip then
  redis.call('HDEL', KEYS[1], 'trip')
  redis.call('HINCRBY', KEYS[1], 'ov', 1)
end
return st.trip
