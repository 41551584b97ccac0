"""The shared ledger's and breaker's scripts (``lua/*.lua``): each operation is one script.

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

from ._lua import source

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


# Helpers shared by every script (prelude.lua), its constants filled in.
_PRELUDE = (
    source("prelude")
    .replace("@SATURATE@", str(2 * STORE_MAX))
    .replace("@MARKS@", str(MARKS))
    .replace("@LINEAGE_MAX@", str(LINEAGE_MAX))
)
# Shared by COMMIT and RELEASE: how a settlement id stands, and remembering it.
_SETTLE = source("settle")

# Each script's KEYS, ARGV and reply are described at the top of its file.
RESERVE = _PRELUDE + source("reserve")
COMMIT = _PRELUDE + _SETTLE + source("commit")
RELEASE = _PRELUDE + _SETTLE + source("release")
TRIP = _PRELUDE + source("trip")
OVERRIDE = _PRELUDE + source("override")
CLEAR_TRIP = _PRELUDE + source("clear_trip")
HEARTBEAT = _PRELUDE + source("heartbeat")
BREAKER = _PRELUDE + source("breaker")
