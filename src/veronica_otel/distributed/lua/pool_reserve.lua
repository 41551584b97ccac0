-- Pool-only scripts (Redis Cluster: the pools' slot; see the two-phase
-- protocol in _pools.py). KEYS: the pool section's. ARGV: the pool section,
-- then four values the script ignores (the ledger's replay queue renews the
-- fourth from last of every queued operation).
-- POOL_RESERVE returns {1, 0, reseeded, report...} (held, or a duplicate: nothing
-- held again) or a denial {5, ...}; POOL_COMMIT / POOL_RELEASE return
-- {0, '', 0, report...} (the shape of a chain settlement's reply, no chain).
local a = pool_args(ARGV, 0)
local keys = {unpack(KEYS, 1, a.np)}
if pool_seen(KEYS, 0, a) then return pool_report(keys, a.np, {1, 0, 0}) end
local now = pool_now(a)
local denied = pool_check(KEYS, 0, ARGV, a, now)
if denied then return denied end
pool_hold(KEYS, 0, ARGV, a, now)
return pool_report(keys, a.np, {1, 0, 0})
