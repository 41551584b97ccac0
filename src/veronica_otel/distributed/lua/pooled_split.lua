-- Combined scripts (one Redis or Valkey server): the chain's operation and
-- the pools' in one atomic script. KEYS: the chain script's, then the pool
-- section's. ARGV: section_length chain_key_count, the pool section, then
-- the chain script's ARGV. Replies: the chain script's reply with each
-- pool's report (e c s t) appended. When a pool denies, POOLED_RESERVE
-- charges nothing and returns that denial {5, ...} (see pool_check) followed
-- by the chain's own verdict (RESERVE's reply, checked only): the client
-- reports the chain's denial first (PoolStore.first_denial).
local np_args = tonumber(ARGV[1])
local nk = tonumber(ARGV[2])
local ko, po = nk, 2
local cargs = {unpack(ARGV, np_args + 3)}
local ckeys = {unpack(KEYS, 1, nk)}
local a = pool_args(ARGV, po)
