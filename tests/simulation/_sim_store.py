"""An in-memory Redis that runs the ledger's real Lua scripts, on a simulated clock.

Used by the deterministic fault simulation (``_sim_ledger.py``): the scripts
of ``distributed/_scripts.py`` run unmodified in Lua 5.1 (``lupa.lua51``, the
Lua of Redis) with ``redis.call``/``redis.pcall``, ``cjson``, ``KEYS`` and
``ARGV``; key TTLs and ``TIME`` follow :attr:`SimStore.now_us`, which only the
simulation moves. :class:`SimClient` has the redis-py surface ``RedisLedger``
uses (``register_script`` returning a callable script, ``evalsha``, ``hmget``,
``execute_command``...), so the real ledger runs on it unchanged.

Every request a client sends goes through one :class:`Transport` hook, so a
fault injector sees commands and scripts alike (including ones added later):
a new command a script uses only needs an entry in :data:`_COMMANDS`. A
command the emulation lacks fails the script loudly (:class:`NotEmulatedError`),
never as a silent nil.

Replies follow Redis: a Lua number becomes an integer (truncated), ``false``
nil, ``true`` 1, a table an array up to its first nil, ``{err=...}`` an error
(``redis.ResponseError`` in the client), ``{ok=...}`` a status string. The
client decodes replies to ``str`` (as ``decode_responses=True``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis

__all__ = [
    "NotEmulatedError",
    "SimClient",
    "SimPipeline",
    "SimScript",
    "SimStore",
    "Transport",
]

_INT = re.compile(r"-?(?:0|[1-9][0-9]*)\Z")
_WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
_I64 = 2**63


class NotEmulatedError(RuntimeError):
    """A script or client used a Redis command the emulation does not have."""


class CommandError(Exception):
    """An error reply of one command (``redis.pcall`` returns it as ``{err=...}``)."""


class _Status(str):
    """A status reply (``+OK``): Lua sees ``{ok=...}``."""


class _ZSet(dict[str, float]):
    """member -> score."""

    def ordered(self) -> list[tuple[str, float]]:
        return sorted(self.items(), key=lambda item: (item[1], item[0]))


def _score_text(score: float) -> str:
    if math.isinf(score):
        return "inf" if score > 0 else "-inf"
    if score.is_integer() and abs(score) < 1e17:
        return str(int(score))
    return repr(score)


def _parse_score(raw: str) -> tuple[float, bool]:
    """A ZRANGEBYSCORE bound: (value, exclusive)."""
    exclusive = raw.startswith("(")
    text = raw[1:] if exclusive else raw
    low = text.lower()
    if low in ("-inf", "+inf", "inf"):
        return (-math.inf if low == "-inf" else math.inf), exclusive
    try:
        return float(text), exclusive
    except ValueError:
        raise CommandError("ERR min or max is not a float") from None


def _parse_int(raw: str, what: str = "value is not an integer or out of range") -> int:
    if _INT.match(raw) is None or not -_I64 <= int(raw) < _I64:
        raise CommandError(f"ERR {what}")
    return int(raw)


class SimStore:
    """The data of one simulated Redis: hashes, sorted sets, strings, TTLs.

    Args:
        now_us: The simulated clock (microseconds since the epoch); move it
            with :meth:`advance`.
    """

    def __init__(self, now_us: int = 1_700_000_000_000_000) -> None:
        self.now_us = now_us
        self.data: dict[str, Any] = {}
        self.expires: dict[str, int] = {}  # key -> expiry, microseconds
        self.up = True
        self.commands = 0  # commands run (scripts' commands included)

    # -- the simulation's levers ----------------------------------------------

    def advance(self, us: int) -> None:
        """Move the clock forward (keys past their TTL vanish on next access)."""
        if us < 0:
            raise ValueError(f"the store clock never goes back, got us={us!r}")
        self.now_us += us

    def wipe(self) -> None:
        """Lose every key (a restart without persistence, or FLUSHALL)."""
        self.data.clear()
        self.expires.clear()

    def live_keys(self) -> list[str]:
        """Keys not expired, sorted."""
        return sorted(k for k in list(self.data) if self._get(k) is not None)

    def digest(self) -> str:
        """A hash of the live data and TTLs (for reproducibility checks)."""
        items = []
        for key in self.live_keys():
            value = self.data[key]
            shown = sorted(value.items()) if isinstance(value, dict) else value
            items.append([key, shown, self.expires.get(key)])
        raw = json.dumps(items, sort_keys=True, default=str)
        return hashlib.sha256(raw.encode()).hexdigest()[:16]

    # -- commands ---------------------------------------------------------------

    def command(self, name: str, args: Sequence[str]) -> Any:
        """Run one command; raises CommandError for an error reply."""
        handler = _COMMANDS.get(name.upper())
        if handler is None:
            raise NotEmulatedError(
                f"Redis command {name.upper()!r} is not emulated by SimStore "
                "(add it to _COMMANDS in tests/simulation/_sim_store.py)"
            )
        self.commands += 1
        return handler(self, args if isinstance(args, list) else list(args))

    def run_script(self, source: str, keys: Sequence[str], args: Sequence[str]) -> Any:
        """EVAL: the script's reply, converted as Redis does (ResponseError on error)."""
        return _lua().run(self, source, [str(k) for k in keys], [str(a) for a in args])

    def _get(self, key: str) -> Any:
        expiry = self.expires.get(key)
        if expiry is not None and expiry <= self.now_us:
            del self.expires[key]
            self.data.pop(key, None)
            return None
        return self.data.get(key)

    def _hash(self, key: str, create: bool = False) -> dict[str, str] | None:
        value = self._get(key)
        if value is None:
            if not create:
                return None
            value = self.data[key] = {}
        if type(value) is not dict:
            raise CommandError(_WRONGTYPE)
        return value

    def _zset(self, key: str, create: bool = False) -> _ZSet | None:
        value = self._get(key)
        if value is None:
            if not create:
                return None
            value = self.data[key] = _ZSet()
        if not isinstance(value, _ZSet):
            raise CommandError(_WRONGTYPE)
        return value

    def _string(self, key: str) -> str | None:
        value = self._get(key)
        if value is not None and not isinstance(value, str):
            raise CommandError(_WRONGTYPE)
        return value

    def _delete(self, key: str) -> bool:
        present = self._get(key) is not None
        self.data.pop(key, None)
        self.expires.pop(key, None)
        return present

    def _drop_if_empty(self, key: str) -> None:
        value = self.data.get(key)
        if isinstance(value, dict) and not value:
            self._delete(key)


# Each handler: (store, args) -> reply (int, str, None, list, _Status).


def _arity(args: list[str], n: int, name: str, more: bool = False) -> None:
    if len(args) < n or (not more and len(args) != n):
        raise CommandError(f"ERR wrong number of arguments for '{name.lower()}' command")


def _time(s: SimStore, a: list[str]) -> Any:
    return [str(s.now_us // 1_000_000), str(s.now_us % 1_000_000)]


def _hget(s: SimStore, a: list[str]) -> Any:
    _arity(a, 2, "HGET")
    h = s._hash(a[0])
    return None if h is None else h.get(a[1])


def _hmget(s: SimStore, a: list[str]) -> Any:
    _arity(a, 2, "HMGET", more=True)
    h = s._hash(a[0]) or {}
    return [h.get(f) for f in a[1:]]


def _hset(s: SimStore, a: list[str]) -> Any:
    if len(a) < 3 or len(a) % 2 == 0:
        raise CommandError("ERR wrong number of arguments for 'hset' command")
    h = s._hash(a[0], create=True)
    assert h is not None
    added = 0
    for i in range(1, len(a), 2):
        added += a[i] not in h
        h[a[i]] = a[i + 1]
    return added


def _hmset(s: SimStore, a: list[str]) -> Any:
    _hset(s, a)
    return _Status("OK")


def _hsetnx(s: SimStore, a: list[str]) -> Any:
    _arity(a, 3, "HSETNX")
    h = s._hash(a[0], create=True)
    assert h is not None
    if a[1] in h:
        return 0
    h[a[1]] = a[2]
    return 1


def _hdel(s: SimStore, a: list[str]) -> Any:
    _arity(a, 2, "HDEL", more=True)
    h = s._hash(a[0])
    if h is None:
        return 0
    removed = sum(h.pop(f, None) is not None for f in a[1:])
    s._drop_if_empty(a[0])
    return removed


def _hlen(s: SimStore, a: list[str]) -> Any:
    _arity(a, 1, "HLEN")
    return len(s._hash(a[0]) or {})


def _hexists(s: SimStore, a: list[str]) -> Any:
    _arity(a, 2, "HEXISTS")
    return int(a[1] in (s._hash(a[0]) or {}))


def _hgetall(s: SimStore, a: list[str]) -> Any:
    _arity(a, 1, "HGETALL")
    out: list[str] = []
    for k, v in (s._hash(a[0]) or {}).items():
        out += [k, v]
    return out


def _hkeys(s: SimStore, a: list[str]) -> Any:
    _arity(a, 1, "HKEYS")
    return list(s._hash(a[0]) or {})


def _hincrby(s: SimStore, a: list[str]) -> Any:
    _arity(a, 3, "HINCRBY")
    by = _parse_int(a[2])
    h = s._hash(a[0], create=True)
    assert h is not None
    old = _parse_int(h.get(a[1], "0"), "hash value is not an integer")
    new = old + by
    if not -_I64 <= new < _I64:
        raise CommandError("ERR increment or decrement would overflow")
    h[a[1]] = str(new)
    return new


def _exists(s: SimStore, a: list[str]) -> Any:
    _arity(a, 1, "EXISTS", more=True)
    return sum(s._get(k) is not None for k in a)


def _del(s: SimStore, a: list[str]) -> Any:
    _arity(a, 1, "DEL", more=True)
    return sum(s._delete(k) for k in a)


def _type(s: SimStore, a: list[str]) -> Any:
    _arity(a, 1, "TYPE")
    v = s._get(a[0])
    name = (
        "none"
        if v is None
        else "zset"
        if isinstance(v, _ZSet)
        else "hash"
        if isinstance(v, dict)
        else "string"
    )
    return _Status(name)


def _expire_in(s: SimStore, key: str, us: int) -> int:
    if s._get(key) is None:
        return 0
    if us <= 0:
        s._delete(key)
    else:
        s.expires[key] = s.now_us + us
    return 1


def _pexpire(s: SimStore, a: list[str]) -> Any:
    _arity(a, 2, "PEXPIRE")
    return _expire_in(s, a[0], _parse_int(a[1]) * 1000)


def _expire(s: SimStore, a: list[str]) -> Any:
    _arity(a, 2, "EXPIRE")
    return _expire_in(s, a[0], _parse_int(a[1]) * 1_000_000)


def _pexpireat(s: SimStore, a: list[str]) -> Any:
    _arity(a, 2, "PEXPIREAT")
    return _expire_in(s, a[0], _parse_int(a[1]) * 1000 - s.now_us)


def _persist(s: SimStore, a: list[str]) -> Any:
    _arity(a, 1, "PERSIST")
    if s._get(a[0]) is None or a[0] not in s.expires:
        return 0
    del s.expires[a[0]]
    return 1


def _pttl_us(s: SimStore, key: str) -> int | None:
    """Remaining microseconds, -1 without TTL, None for a missing key."""
    if s._get(key) is None:
        return None
    expiry = s.expires.get(key)
    return -1 if expiry is None else expiry - s.now_us


def _pttl(s: SimStore, a: list[str]) -> Any:
    _arity(a, 1, "PTTL")
    left = _pttl_us(s, a[0])
    return -2 if left is None else left if left < 0 else (left + 999) // 1000


def _ttl(s: SimStore, a: list[str]) -> Any:
    _arity(a, 1, "TTL")
    left = _pttl_us(s, a[0])
    return -2 if left is None else left if left < 0 else (left + 999_999) // 1_000_000


def _get(s: SimStore, a: list[str]) -> Any:
    _arity(a, 1, "GET")
    return s._string(a[0])


def _set(s: SimStore, a: list[str]) -> Any:
    _arity(a, 2, "SET", more=True)
    key, value = a[0], a[1]
    opts = [o.upper() for o in a[2:]]
    ttl_us: int | None = None
    i = 0
    while i < len(opts):
        if opts[i] in ("PX", "EX") and i + 1 < len(opts):
            ttl_us = _parse_int(a[2 + i + 1]) * (1000 if opts[i] == "PX" else 1_000_000)
            i += 2
        elif opts[i] in ("NX", "XX"):
            i += 1
        else:
            raise CommandError("ERR syntax error")
    present = s._get(key) is not None
    if ("NX" in opts and present) or ("XX" in opts and not present):
        return None
    s.data[key] = value
    s.expires.pop(key, None)
    if ttl_us is not None:
        s.expires[key] = s.now_us + ttl_us
    return _Status("OK")


def _incrby(s: SimStore, a: list[str]) -> Any:
    _arity(a, 2, "INCRBY")
    old = _parse_int(s._string(a[0]) or "0")
    new = old + _parse_int(a[1])
    if not -_I64 <= new < _I64:
        raise CommandError("ERR increment or decrement would overflow")
    s.data[a[0]] = str(new)
    return new


def _incr(s: SimStore, a: list[str]) -> Any:
    _arity(a, 1, "INCR")
    return _incrby(s, [a[0], "1"])


def _zadd(s: SimStore, a: list[str]) -> Any:
    _arity(a, 3, "ZADD", more=True)
    flags: set[str] = set()
    i = 1
    while i < len(a) and a[i].upper() in ("NX", "XX", "GT", "LT", "CH"):
        flags.add(a[i].upper())
        i += 1
    rest = a[i:]
    if not rest or len(rest) % 2:
        raise CommandError("ERR syntax error")
    pairs = []
    for j in range(0, len(rest), 2):
        try:
            score = float(rest[j])
        except ValueError:
            raise CommandError("ERR value is not a valid float") from None
        pairs.append((score, rest[j + 1]))
    z = s._zset(a[0], create=True)
    assert z is not None
    added = changed = 0
    for score, member in pairs:
        old = z.get(member)
        if old is None:
            if "XX" in flags:
                continue
            z[member] = score
            added += 1
        elif "NX" not in flags and old != score:
            if ("GT" in flags and score <= old) or ("LT" in flags and score >= old):
                continue
            z[member] = score
            changed += 1
    s._drop_if_empty(a[0])
    return added + changed if "CH" in flags else added


def _zrem(s: SimStore, a: list[str]) -> Any:
    _arity(a, 2, "ZREM", more=True)
    z = s._zset(a[0])
    if z is None:
        return 0
    removed = sum(z.pop(m, None) is not None for m in a[1:])
    s._drop_if_empty(a[0])
    return removed


def _zscore(s: SimStore, a: list[str]) -> Any:
    _arity(a, 2, "ZSCORE")
    z = s._zset(a[0])
    score = None if z is None else z.get(a[1])
    return None if score is None else _score_text(score)


def _zcard(s: SimStore, a: list[str]) -> Any:
    _arity(a, 1, "ZCARD")
    return len(s._zset(a[0]) or {})


def _in_range(score: float, low: tuple[float, bool], high: tuple[float, bool]) -> bool:
    above = score > low[0] if low[1] else score >= low[0]
    below = score < high[0] if high[1] else score <= high[0]
    return above and below


def _zrangebyscore(s: SimStore, a: list[str]) -> Any:
    _arity(a, 3, "ZRANGEBYSCORE", more=True)
    low, high = _parse_score(a[1]), _parse_score(a[2])
    scores = False
    offset, count = 0, -1
    i = 3
    while i < len(a):
        opt = a[i].upper()
        if opt == "WITHSCORES":
            scores = True
            i += 1
        elif opt == "LIMIT" and i + 2 < len(a):
            offset, count = _parse_int(a[i + 1]), _parse_int(a[i + 2])
            i += 3
        else:
            raise CommandError("ERR syntax error")
    hits = [(m, sc) for m, sc in (s._zset(a[0]) or _ZSet()).ordered() if _in_range(sc, low, high)]
    hits = hits[offset:] if count < 0 else hits[offset : offset + count]
    out: list[str] = []
    for member, score in hits:
        out += [member, _score_text(score)] if scores else [member]
    return out


def _zremrangebyscore(s: SimStore, a: list[str]) -> Any:
    _arity(a, 3, "ZREMRANGEBYSCORE")
    low, high = _parse_score(a[1]), _parse_score(a[2])
    z = s._zset(a[0])
    if z is None:
        return 0
    gone = [m for m, sc in z.items() if _in_range(sc, low, high)]
    for m in gone:
        del z[m]
    s._drop_if_empty(a[0])
    return len(gone)


def _rank_slice(n: int, start: int, stop: int) -> tuple[int, int]:
    start = max(start + n if start < 0 else start, 0)
    stop = stop + n if stop < 0 else stop
    return start, stop


def _zremrangebyrank(s: SimStore, a: list[str]) -> Any:
    _arity(a, 3, "ZREMRANGEBYRANK")
    z = s._zset(a[0])
    if z is None:
        return 0
    items = z.ordered()
    start, stop = _rank_slice(len(items), _parse_int(a[1]), _parse_int(a[2]))
    gone = items[start : stop + 1]
    for member, _ in gone:
        del z[member]
    s._drop_if_empty(a[0])
    return len(gone)


def _zrange(s: SimStore, a: list[str]) -> Any:
    _arity(a, 3, "ZRANGE", more=True)
    items = (s._zset(a[0]) or _ZSet()).ordered()
    start, stop = _parse_int(a[1]), _parse_int(a[2])
    start, stop = _rank_slice(len(items), start, stop)
    scores = any(o.upper() == "WITHSCORES" for o in a[3:])
    out: list[str] = []
    for member, score in items[start : stop + 1]:
        out += [member, _score_text(score)] if scores else [member]
    return out


def _zpopmin(s: SimStore, a: list[str]) -> Any:
    _arity(a, 1, "ZPOPMIN", more=True)
    count = _parse_int(a[1]) if len(a) > 1 else 1
    z = s._zset(a[0])
    if z is None:
        return []
    out: list[str] = []
    for member, score in z.ordered()[:count]:
        del z[member]
        out += [member, _score_text(score)]
    s._drop_if_empty(a[0])
    return out


def _zincrby(s: SimStore, a: list[str]) -> Any:
    _arity(a, 3, "ZINCRBY")
    z = s._zset(a[0], create=True)
    assert z is not None
    z[a[2]] = z.get(a[2], 0.0) + float(a[1])
    return _score_text(z[a[2]])


def _ping(s: SimStore, a: list[str]) -> Any:
    return _Status("PONG")


def _flushall(s: SimStore, a: list[str]) -> Any:
    s.wipe()
    return _Status("OK")


_COMMANDS: dict[str, Callable[[SimStore, list[str]], Any]] = {
    "TIME": _time,
    "HGET": _hget,
    "HMGET": _hmget,
    "HSET": _hset,
    "HMSET": _hmset,
    "HSETNX": _hsetnx,
    "HDEL": _hdel,
    "HLEN": _hlen,
    "HEXISTS": _hexists,
    "HGETALL": _hgetall,
    "HKEYS": _hkeys,
    "HINCRBY": _hincrby,
    "EXISTS": _exists,
    "DEL": _del,
    "UNLINK": _del,
    "TYPE": _type,
    "EXPIRE": _expire,
    "PEXPIRE": _pexpire,
    "PEXPIREAT": _pexpireat,
    "PERSIST": _persist,
    "TTL": _ttl,
    "PTTL": _pttl,
    "GET": _get,
    "SET": _set,
    "INCR": _incr,
    "INCRBY": _incrby,
    "ZADD": _zadd,
    "ZREM": _zrem,
    "ZSCORE": _zscore,
    "ZCARD": _zcard,
    "ZRANGE": _zrange,
    "ZRANGEBYSCORE": _zrangebyscore,
    "ZREMRANGEBYSCORE": _zremrangebyscore,
    "ZREMRANGEBYRANK": _zremrangebyrank,
    "ZPOPMIN": _zpopmin,
    "ZINCRBY": _zincrby,
    "PING": _ping,
    "FLUSHALL": _flushall,
    "FLUSHDB": _flushall,
}


# -- Lua ------------------------------------------------------------------------

# Installs redis.* and cjson over three Python callables; wraps a script body
# as a function of (KEYS, ARGV) whose errors come back as (false, message).
_BOOT = r"""
local py_call, json_encode, json_decode = ...
redis = {}
function redis.pcall(...) return py_call(...) end
function redis.call(...)
  local r = py_call(...)
  if type(r) == 'table' and r.err then error(r) end
  return r
end
function redis.error_reply(m) return {err = m} end
function redis.status_reply(m) return {ok = m} end
function redis.sha1hex(s) return '' end
redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_NOTICE, redis.LOG_WARNING = 0, 1, 2, 3
function redis.log() end
cjson = {encode = json_encode, decode = json_decode}
return function(body)
  return function(keys, argv)
    local ok, res = pcall(body, keys, argv)
    if ok then return true, res end
    if type(res) == 'table' and res.err then return false, res.err end
    return false, tostring(res)
  end
end
"""


class _Lua:
    """One Lua 5.1 runtime for the whole process; scripts compiled once."""

    def __init__(self) -> None:
        from lupa import lua51  # an optional test dependency (the dev extra)

        self._lua51: Any = lua51
        self.runtime: Any = lua51.LuaRuntime(encoding="utf-8", unpack_returned_tuples=True)
        self.store: SimStore | None = None
        self.missing: NotEmulatedError | None = None
        wrap = self.runtime.execute(_BOOT, self._call, self._encode, self._decode)
        self._wrap = wrap
        self._scripts: dict[str, Any] = {}

    def compile(self, source: str) -> Any:
        fn = self._scripts.get(source)
        if fn is None:
            body = self.runtime.execute("return function(KEYS, ARGV)\n" + source + "\nend")
            fn = self._scripts[source] = self._wrap(body)
        return fn

    def run(self, store: SimStore, source: str, keys: list[str], args: list[str]) -> Any:
        fn = self.compile(source)
        table = self.runtime.table_from
        self.store, self.missing = store, None
        try:
            ok, result = fn(table(keys), table(args))
        finally:
            self.store = None
        if self.missing is not None:
            raise self.missing
        if not ok:
            raise redis.ResponseError(str(result))
        return self._reply(result)

    # Lua -> Redis reply (as redis-py returns it with decode_responses=True).
    def _reply(self, value: Any) -> Any:
        if value is None or value is False:
            return None
        if value is True:
            return 1
        if isinstance(value, (int, float)):
            return int(value)
        if isinstance(value, str):
            return value
        if self._lua51.lua_type(value) == "table":
            err = value["err"]
            if err is not None:
                raise redis.ResponseError(str(err))
            ok = value["ok"]
            if ok is not None:
                return str(ok)
            out = []
            i = 1
            while (item := value[i]) is not None:
                out.append(self._reply(item) if item is not False else None)
                i += 1
            return out
        return None

    # redis.pcall: Lua arguments -> a command -> a Lua value.
    def _call(self, *args: Any) -> Any:
        store = self.store
        assert store is not None
        if not args:
            return self.runtime.table_from({"err": "ERR Please specify at least one argument"})
        words = [a if type(a) is str else _arg_text(a) for a in args]
        if None in words:
            return self.runtime.table_from(
                {"err": "ERR Lua redis lib command arguments must be strings or integers"}
            )
        checked: list[str] = words  # type: ignore[assignment]  # no None (checked above)
        try:
            reply = store.command(checked[0], checked[1:])
        except NotEmulatedError as exc:
            self.missing = exc
            return self.runtime.table_from({"err": str(exc)})
        except CommandError as exc:
            return self.runtime.table_from({"err": str(exc)})
        return self._to_lua(reply)

    def _to_lua(self, reply: Any) -> Any:
        if reply is None:
            return False
        if isinstance(reply, _Status):
            return self.runtime.table_from({"ok": str(reply)})
        if isinstance(reply, list):
            return self.runtime.table_from([self._to_lua(item) for item in reply])
        return reply

    def _encode(self, value: Any) -> str:
        return json.dumps(self._from_lua(value), ensure_ascii=False, separators=(",", ":"))

    def _decode(self, raw: str) -> Any:
        return self._json_to_lua(json.loads(raw))

    def _from_lua(self, value: Any) -> Any:
        if self._lua51.lua_type(value) == "table":
            items = dict(value.items())
            if all(isinstance(k, (int, float)) for k in items) and items:
                return [self._from_lua(items[k]) for k in sorted(items)]
            return {str(k): self._from_lua(v) for k, v in items.items()}
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    def _json_to_lua(self, value: Any) -> Any:
        if isinstance(value, list):
            return self.runtime.table_from([self._json_to_lua(v) for v in value])
        if isinstance(value, dict):
            return self.runtime.table_from({k: self._json_to_lua(v) for k, v in value.items()})
        return value


def _arg_text(value: Any) -> str | None:
    """A Lua argument as Redis turns it into a command word."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 2**63:
            return str(int(value))
        return repr(value)
    return None


_RUNTIME: _Lua | None = None


def _lua() -> _Lua:
    global _RUNTIME
    if _RUNTIME is None:
        _RUNTIME = _Lua()
    return _RUNTIME


# -- the client -----------------------------------------------------------------


class Transport(Protocol):
    """Carries one request of ``client`` to the store: ``apply()`` runs it there.

    The default raises ``redis.ConnectionError`` while the store is down; a
    fault injector may also drop the request, apply it twice, or lose its
    reply (run ``apply`` and then raise).
    """

    def __call__(self, client: SimClient, label: str, apply: Callable[[], Any]) -> Any: ...


def direct(client: SimClient, label: str, apply: Callable[[], Any]) -> Any:
    """The fault-free transport."""
    if not client.store.up:
        raise redis.ConnectionError(f"simulated store down ({label})")
    return apply()


@functools.cache
def _sha1(source: str) -> str:
    # Each RedisLedger registers its sixteen scripts: a run makes dozens of ledgers.
    return hashlib.sha1(source.encode()).hexdigest()


class SimScript:
    """What ``register_script`` returns: ``script(keys, args)`` runs it (EVALSHA)."""

    def __init__(self, client: SimClient, source: str) -> None:
        self.registered_client = client
        self.script = source
        self.sha = _sha1(source)

    def __call__(
        self,
        keys: Sequence[Any] = (),
        args: Sequence[Any] = (),
        client: SimClient | None = None,
    ) -> Any:
        target = client or self.registered_client
        return target.run_script(self.script, keys, args)


class SimClient:
    """A redis-py-like client of one :class:`SimStore` (replies decoded to str).

    Args:
        store: The store it talks to.
        transport: Carries each request (faults are injected there).
        name: Shown in transport labels and ``repr``.
    """

    def __init__(self, store: SimStore, transport: Transport = direct, name: str = "sim") -> None:
        self.store = store
        self.transport = transport
        self.name = name
        self._shas: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"SimClient({self.name!r})"

    def register_script(self, script: str | bytes) -> SimScript:
        source = script.decode() if isinstance(script, bytes) else script
        registered = SimScript(self, source)
        self._shas[registered.sha] = source
        return registered

    def script_load(self, script: str) -> str:
        return self.register_script(script).sha

    def run_script(self, source: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        store = self.store
        label = "EVALSHA " + _script_name(source)
        return self.transport(self, label, lambda: store.run_script(source, keys, args))

    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Any:
        return self.run_script(script, keys_and_args[:numkeys], keys_and_args[numkeys:])

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        source = self._shas.get(sha)
        if source is None:
            raise redis.exceptions.NoScriptError("NOSCRIPT No matching script.")
        return self.eval(source, numkeys, *keys_and_args)

    def execute_command(self, *args: Any) -> Any:
        name = str(args[0]).upper()
        words = [str(a) for a in args[1:]]
        store = self.store

        def apply() -> Any:
            try:
                return _plain(store.command(name, words))
            except CommandError as exc:
                raise redis.ResponseError(str(exc)) from None

        return self.transport(self, name, apply)

    def hmget(self, name: str, keys: Any, *args: Any) -> Any:
        fields = [keys] if isinstance(keys, (str, bytes)) else list(keys)
        return self.execute_command("HMGET", name, *fields, *args)

    def hgetall(self, name: str) -> dict[str, str]:
        flat = self.execute_command("HGETALL", name)
        return dict(zip(flat[::2], flat[1::2], strict=True))

    def exists(self, *names: str) -> Any:
        return self.execute_command("EXISTS", *names)

    def delete(self, *names: str) -> Any:
        return self.execute_command("DEL", *names)

    def ping(self) -> bool:
        self.execute_command("PING")
        return True

    def time(self) -> tuple[int, int]:
        sec, usec = self.execute_command("TIME")
        return int(sec), int(usec)

    def flushall(self) -> bool:
        self.execute_command("FLUSHALL")
        return True

    def config_get(self, pattern: str = "*") -> dict[str, str]:
        """CONFIG is disabled here, as on many managed stores."""

        def apply() -> Any:
            raise redis.ResponseError("ERR unknown command 'CONFIG' (disabled in the simulation)")

        result: dict[str, str] = self.transport(self, "CONFIG", apply)
        return result

    def pipeline(self, transaction: bool = True) -> SimPipeline:
        return SimPipeline(self)

    def close(self) -> None:
        pass


class SimPipeline:
    """``client.pipeline()``: calls are queued, ``execute()`` runs them in order
    and raises the first error (as redis-py does with ``raise_on_error``)."""

    def __init__(self, client: SimClient) -> None:
        self._client = client
        self._queued: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Callable[..., SimPipeline]:
        if name.startswith("_") or not callable(getattr(self._client, name, None)):
            raise AttributeError(name)

        def queue(*args: Any) -> SimPipeline:
            self._queued.append((name, args))
            return self

        return queue

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        queued, self._queued = self._queued, []
        replies: list[Any] = []
        for name, args in queued:
            try:
                replies.append(getattr(self._client, name)(*args))
            except redis.ResponseError as exc:
                if raise_on_error:
                    raise
                replies.append(exc)
        return replies

    def __enter__(self) -> SimPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self._queued = []


def _plain(reply: Any) -> Any:
    if isinstance(reply, _Status):
        return str(reply)
    return reply


def _script_name(source: str) -> str:
    """The ledger's name for a script (RESERVE, COMMIT...), or its sha prefix."""
    names = _script_names()
    return names.get(source) or hashlib.sha1(source.encode()).hexdigest()[:8]


_NAMES: dict[str, str] | None = None


def _script_names() -> dict[str, str]:
    global _NAMES
    if _NAMES is None:
        from veronica_otel.distributed import _scripts

        _NAMES = {
            value: name
            for name, value in vars(_scripts).items()
            if name.isupper() and isinstance(value, str) and "redis." in value
        }
    return _NAMES
