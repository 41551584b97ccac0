"""Declarative policy: default limits, per-model and per-tool rules, and prices in one file.

Usage::

    from veronica_otel import ExecutionContext, PolicyPipeline
    from veronica_otel.policy_file import FilePolicy, PolicyFile

    policy = PolicyFile("policy.toml")
    ctx = ExecutionContext(
        policy.default_config(),
        PolicyPipeline([FilePolicy(policy)]),
        price_table=policy.price_table(),
    )

Under ``opentelemetry-instrument`` nothing is written: set
``VERONICA_POLICY_FILE=policy.toml`` and the process default chain follows the
file (:func:`install_default_chain`).

Configuration (TOML; the same tree in a ``.yaml`` / ``.yml`` file when PyYAML
is installed)::

    unknown_model_price_usd_per_mtok = 5.0  # models nobody prices

    [limits]                 # default chain limits: ExecutionConfig's fields
    max_cost_usd = 2.0       # VERONICA_* variables take precedence
    max_steps = 100

    [prices."openai:my-finetune"]  # USD per 1M tokens; "provider:model" or "model"
    input = 3.0
    output = 12.0
    cached_input = 1.5       # optional, as are reasoning and cache_write

    [prices."ollama:*"]      # "provider:*": every model of the provider not priced
    input = 0.0              # by name (ahead of genai-prices): a local server's
    output = 0.0             # models free under a cost ceiling

    [prices."openai:gpt-image-1"]  # endpoints billed per unit (images.*: per_image,
    per_image = 0.25         # audio.speech: per_character, videos: per_second), USD;
                             # the dearest size/quality you send (list prices of
                             # dall-e-2/3, tts-1(-hd), sora-2(-pro) are built in)

    [prices."openai:batches"]  # work billed after the call returns (batches,
    per_request = 25.0       # fine_tuning.jobs, beta.threads.runs, ...; whisper-1 by
                             # model): the most one call may spend, reserved whole;
                             # without it such a call is refused under a cost ceiling

    [models]                 # a name only the deployment knows, priced as a model
    "my-gpt4o-deploy" = "gpt-4o"  # (Azure deployment names; VERONICA_MODEL_ALIASES wins)

    [models."gpt-4o"]        # "model" or "provider:model", case-insensitive
    fallback = "gpt-4o-mini" # send this model instead
    max_tokens = 1000        # clamp each call's output tokens
    max_calls = 50           # per chain

    [tools."web_search"]     # a tool call's name, exactly
    max_calls = 10           # per chain
    cost_usd = 0.01          # USD per call, counted against max_cost_usd

    [agents."researcher"]    # an agent's name: agent("researcher") or a span's
    max_cost_usd = 0.2       # gen_ai.agent.name (AG2's Agent.ask); per chain, summed
    max_steps = 10           # over the agent's entries (and max_tokens,
                             # max_retries_total, max_repeats); code's config wins

    [pools."tenant:acme"]    # a budget pool (PolicyFile.pool, VERONICA_POOLS)
    max_cost_usd = 50.0      # and/or max_steps, max_tokens
    window = "1d"            # rolling: "30s", "15m", "1h", "1d", seconds; omit: lifetime

A tool's ``cost_usd`` goes into the process-wide tool price table
(:func:`veronica_otel.set_tool_prices`), which every contained tool call
reads (``contained_tool``, ``ToolCall``, the MCP instrumentor). A file that
prices tools sets that table when it is loaded and again whenever a reload
changes the prices (removing them all clears it); a file that prices no tool
leaves prices set in code alone.

Every rule is enforced or the file is rejected (:class:`PolicyFileError`
names the file, the key path and the value). The file is re-read when its
modification time, size or inode changes, checked at most once per
``check_interval_s`` by the calls that read it: no thread. A malformed new
version keeps the last good policy and logs an ERROR once; the first version
must be valid.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path

from veronica_otel import _propagation
from veronica_otel._config import ExecutionConfig
from veronica_otel._context import ExecutionContext
from veronica_otel._fork import remake_locks_after_fork
from veronica_otel._ledger import Ledger
from veronica_otel._policy import PolicyPipeline
from veronica_otel._policy_rules import FilePolicy
from veronica_otel._policy_schema import (
    ModelRule,
    PolicyFileError,
    PolicySpec,
    PoolRule,
    ToolRule,
    load_policy,
)
from veronica_otel._pools import BudgetPool
from veronica_otel._pricing import (
    MODEL_ALIASES_ENV,
    UNKNOWN_MODEL_PRICE_ENV,
    PriceTable,
    UnitPrices,
    parse_model_aliases,
)
from veronica_otel._tools import set_tool_prices
from veronica_otel._units import check_usd

__all__ = [
    "POLICY_FILE_ENV",
    "FilePolicy",
    "ModelRule",
    "PolicyFile",
    "PolicyFileError",
    "PolicyFileListener",
    "PolicySpec",
    "PoolRule",
    "ToolRule",
    "install_default_chain",
]

POLICY_FILE_ENV = "VERONICA_POLICY_FILE"
# The public module's name, shared with _file_pools: what users configure.
_logger = logging.getLogger("veronica_otel.policy_file")
_Stamp = tuple[int, int, int, int]  # (mtime_ns, size, inode, device)
_GONE: _Stamp = (-1, -1, -1, -1)


class PolicyFileListener:
    """Hears about a policy file's new versions; every method is a no-op by default."""

    def on_reload(self, policy_file: PolicyFile, spec: PolicySpec) -> None:
        """A new valid version is now current."""

    def on_error(self, policy_file: PolicyFile, error: PolicyFileError) -> None:
        """A new version was rejected (or the file vanished); the last good one stays."""


class PolicyFile:
    """A policy file, re-read when it changes.

    Args:
        path: A ``.toml``, ``.yaml`` or ``.yml`` file.
        check_interval_s: Look at the file at most this often (0: on every read).
        clock: Monotonic seconds; injectable for tests.

    Raises:
        PolicyFileError: The file cannot be read or is not a valid policy: at
            start-up nothing runs with half a policy.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        check_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise TypeError(f"path must be a non-empty str or os.PathLike, got {path!r}")
        if (
            isinstance(check_interval_s, bool)
            or not isinstance(check_interval_s, (int, float))
            or not math.isfinite(check_interval_s)
            or check_interval_s < 0
        ):
            raise ValueError(f"check_interval_s must be finite and >= 0, got {check_interval_s!r}")
        if not callable(clock):
            raise TypeError(f"clock must be callable, got {clock!r}")
        self._path = Path(path)
        self._interval = float(check_interval_s)
        self._clock = clock
        self._lock = threading.Lock()
        remake_locks_after_fork(self)
        self._listeners: list[PolicyFileListener] = []
        stamp = _stat(self._path)
        self._state: tuple[int, PolicySpec] = (1, load_policy(self._path))
        _apply_tool_prices(None, self._state[1])
        self._stamp: _Stamp = stamp
        self._rejected: _Stamp | None = None
        self._next_check = clock() + self._interval

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        check_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> PolicyFile | None:
        """The file named by ``VERONICA_POLICY_FILE``, or None when it is unset.

        Raises:
            PolicyFileError: The file named is missing or invalid (the message
                names the file and the variable).
        """
        env = os.environ if environ is None else environ
        path = env.get(POLICY_FILE_ENV, "").strip()
        if not path:
            return None
        try:
            return cls(path, check_interval_s=check_interval_s, clock=clock)
        except PolicyFileError as exc:
            raise exc.from_variable(POLICY_FILE_ENV) from None

    @property
    def path(self) -> Path:
        return self._path

    @property
    def version(self) -> int:
        """1 for the first load, +1 for each reload that changed the rules."""
        return self.snapshot()[0]

    def current(self) -> PolicySpec:
        """The rules now in force (re-reading the file if it is time to look)."""
        return self.snapshot()[1]

    def snapshot(self) -> tuple[int, PolicySpec]:
        """The version number and the rules now in force."""
        if self._clock() < self._next_check:
            return self._state
        return self._check(force=False)[0]

    def refresh(self) -> bool:
        """Look at the file now; True when a new version became current."""
        return self._check(force=True)[1]

    def add_listener(self, listener: PolicyFileListener) -> None:
        """Call ``listener`` on each reload and each rejected version."""
        if not isinstance(listener, PolicyFileListener):
            raise TypeError(f"listener must be a PolicyFileListener, got {listener!r}")
        with self._lock:
            self._listeners.append(listener)

    def default_config(self, environ: Mapping[str, str] | None = None) -> ExecutionConfig:
        """Chain limits: each ``VERONICA_*`` variable that is set, else the file's ``[limits]``.

        Raises:
            ValueError: A ``VERONICA_*`` variable is malformed (named in the message).
        """
        env = ExecutionConfig.from_env(environ)
        file = self.current().limits
        values = {
            f.name: getattr(file, f.name) if getattr(env, f.name) is None else getattr(env, f.name)
            for f in fields(ExecutionConfig)
        }
        return ExecutionConfig(**values)

    def pool(self, name: str, *, ledger: Ledger | None = None) -> BudgetPool:
        """The budget pool ``[pools."name"]`` defines, following this file's reloads.

        Its limits and window are re-read from the current version on every
        reservation, so a reload applies them from the next call (a version
        without the table keeps the last limits). Pools with the same name
        and ledger share one budget, however many are made.

        Raises:
            ValueError: The file's current version does not define ``name``.
        """
        from veronica_otel._file_pools import FilePool

        return FilePool(self, name, ledger=ledger)

    def price_table(self, environ: Mapping[str, str] | None = None) -> PriceTable:
        """A :class:`PriceTable` that always prices with the current version's ``[prices]``.

        ``VERONICA_UNKNOWN_MODEL_PRICE``, when set, takes precedence over the
        file's ``unknown_model_price_usd_per_mtok``; ``VERONICA_MODEL_ALIASES``
        adds to the file's ``[models]`` aliases (the variable wins a name both map).

        Raises:
            ValueError: ``VERONICA_UNKNOWN_MODEL_PRICE`` or
                ``VERONICA_MODEL_ALIASES`` is malformed (named in the message).
        """
        env = os.environ if environ is None else environ
        aliases = parse_model_aliases(env.get(MODEL_ALIASES_ENV, ""))
        return _FilePriceTable(self, _env_unknown_price(environ), aliases)

    def _check(self, *, force: bool) -> tuple[tuple[int, PolicySpec], bool]:
        with self._lock:
            now = self._clock()
            if not force and now < self._next_check:
                return self._state, False
            self._next_check = now + self._interval
            event = self._reload()
            listeners = list(self._listeners)
            state = self._state
        for listener in listeners:  # outside the lock: a listener may read the file
            try:
                if isinstance(event, PolicyFileError):
                    listener.on_error(self, event)
                elif event is not None:
                    listener.on_reload(self, event)
            except Exception:
                _logger.exception("policy file listener %r failed", listener)
        return state, isinstance(event, PolicySpec)

    def _reload(self) -> PolicySpec | PolicyFileError | None:
        error: PolicyFileError | None = None
        try:
            stamp = _stat(self._path)
        except PolicyFileError as exc:
            stamp, error = _GONE, exc
        if stamp == self._stamp:
            self._rejected = None
            return None
        if stamp == self._rejected:
            return None  # this bad version was reported already
        version, current = self._state
        if error is None:
            try:
                spec = load_policy(self._path)
            except PolicyFileError as exc:
                error = exc
        if error is not None:
            self._rejected = stamp
            _logger.error(
                "veronica-otel: %s; keeping the last good policy (version %d)", error, version
            )
            return error
        self._stamp, self._rejected = stamp, None
        if spec == current:
            return None
        self._state = (version + 1, spec)
        _apply_tool_prices(current, spec)
        _logger.info("veronica-otel: policy file %s reloaded (version %d)", self._path, version + 1)
        return spec

    def __repr__(self) -> str:
        return f"PolicyFile({str(self._path)!r}, version={self._state[0]})"


def _tool_prices(spec: PolicySpec | None) -> dict[str, float]:
    if spec is None:
        return {}
    return {name: rule.cost_usd for name, rule in spec.tools.items() if rule.cost_usd is not None}


def _apply_tool_prices(old: PolicySpec | None, new: PolicySpec) -> None:
    """Set the tool price table from ``new`` when its prices differ from ``old``'s."""
    prices = _tool_prices(new)
    if prices != _tool_prices(old):
        set_tool_prices(prices)


def _stat(path: Path) -> _Stamp:
    try:
        st = path.stat()
    except OSError as exc:
        raise PolicyFileError(str(path), f"cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:  # a path no file can have (a NUL byte)
        raise PolicyFileError(str(path), f"cannot be read ({exc})") from None
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)


class _FilePriceTable(PriceTable):
    """Delegates to a table built once per version of the file."""

    def __init__(
        self, source: PolicyFile, unknown_usd: float | None, env_aliases: Mapping[str, str]
    ) -> None:
        super().__init__()
        self._source = source
        self._unknown_usd = unknown_usd
        self._env_aliases = env_aliases
        self._table: tuple[int, PriceTable] = (0, PriceTable())  # versions start at 1

    def lookup(
        self, provider: str | None, model: str, *, price_context: Mapping[str, str] | None = None
    ) -> UnitPrices | None:
        version, spec = self._source.snapshot()
        built = self._table
        if built[0] != version:
            unknown = self._unknown_usd
            if unknown is None:
                unknown = spec.unknown_model_price_usd_per_mtok
            built = self._table = (
                version,
                PriceTable(
                    spec.prices,
                    aliases={**spec.aliases, **self._env_aliases},  # env wins, as for prices
                    unknown_model_price_usd_per_mtok=unknown,
                ),
            )
        return built[1].lookup(provider, model, price_context=price_context)


def _env_unknown_price(environ: Mapping[str, str] | None) -> float | None:
    env = os.environ if environ is None else environ
    raw = env.get(UNKNOWN_MODEL_PRICE_ENV, "").strip()
    if not raw:
        return None
    try:
        return check_usd(UNKNOWN_MODEL_PRICE_ENV, float(raw))
    except ValueError as exc:
        raise ValueError(
            f"{UNKNOWN_MODEL_PRICE_ENV}={raw!r} is not USD per 1M tokens ({exc})"
        ) from None


def install_default_chain(
    policy_file: PolicyFile,
    environ: Mapping[str, str] | None = None,
    *,
    ledger: Ledger | None = None,
    chain_id: str | None = None,
    pools: Sequence[BudgetPool] = (),
) -> ExecutionContext:
    """Make the process default chain follow ``policy_file``; return it.

    The chain gets :meth:`PolicyFile.default_config`, a :class:`FilePolicy`
    and :meth:`PolicyFile.price_table`. When a reload changes the limits, the
    default chain is rebuilt under the same chain id, so what it has spent
    and any trip carry over; the call that notices the change still runs
    under the old limits, later ones under the new. A deadline keeps
    counting from the first chain's start. A rejected version
    is also reported on stderr, where a person running the app looks.
    ``pools`` (``VERONICA_POOLS`` under zero code, see :meth:`PolicyFile.pool`)
    bound every call of the chain, and of every chain rebuilt after a reload.

    Raises:
        ValueError: A ``VERONICA_*`` variable is malformed.
    """
    keeper = _DefaultChain(policy_file, environ, ledger, chain_id, tuple(pools))
    policy_file.add_listener(keeper)
    _propagation.set_default_context(keeper.context, renew=keeper.renew)
    return keeper.context


class _DefaultChain(PolicyFileListener):
    def __init__(
        self,
        policy_file: PolicyFile,
        environ: Mapping[str, str] | None,
        ledger: Ledger | None = None,
        chain_id: str | None = None,
        pools: tuple[BudgetPool, ...] = (),
    ) -> None:
        self._environ = environ
        self._ledger = ledger
        self._pools = pools
        self._priced = self._pools_priced()
        self._started = time.monotonic()
        self._config = policy_file.default_config(environ)
        rules = FilePolicy(policy_file)
        self._pipeline = PolicyPipeline([rules])
        self._prices = policy_file.price_table(environ)
        self._lock = threading.Lock()
        remake_locks_after_fork(self)
        remake_locks_after_fork(rules)
        self.context = ExecutionContext(
            self._config,
            self._pipeline,
            chain_id=chain_id,
            ledger=ledger,
            price_table=self._prices,
            name="default",
            pools=self._pools,
            detached=True,
        )

    def _pools_priced(self) -> tuple[bool, ...]:
        # A chain decides at birth whether it prices calls (a cost ceiling on
        # it or a pool): a reload that gives a pool its first cost limit, or
        # takes it away, rebuilds the chain like a change of limits.
        return tuple(pool.max_cost_usd is not None for pool in self._pools)

    def on_reload(self, policy_file: PolicyFile, spec: PolicySpec) -> None:
        config = policy_file.default_config(self._environ)
        priced = self._pools_priced()
        with self._lock:
            if config == self._config and priced == self._priced:
                return
            self._priced = priced
            old = self.context
            timeout = config.timeout_ms
            if timeout is not None:  # the deadline runs from the first chain's start
                elapsed_ms = int((time.monotonic() - self._started) * 1000)
                timeout = max(0, timeout - elapsed_ms)
            self.context = ExecutionContext(
                replace(config, timeout_ms=timeout),
                self._pipeline,
                chain_id=old.chain_id,
                ledger=self._ledger,
                price_table=self._prices,
                name="default",
                pools=self._pools,
                detached=True,
            )
            tree = old._state.agent_tree
            if tree is not None:  # its agents' counts carry over too
                self.context._state.agent_tree = tree.adopt(self.context._state)
            self._config = config
            if _propagation._default is old:  # unless someone else replaced it since
                _propagation.set_default_context(self.context, renew=self.renew)
        _logger.info("veronica-otel: default chain %s now has %s", old.chain_id, config)

    def renew(self) -> ExecutionContext:
        """A forked child's own default chain: the current limits, a new chain id."""
        with self._lock:
            self._started = time.monotonic()
            self.context = ExecutionContext(
                self._config,
                self._pipeline,
                ledger=self._ledger,
                price_table=self._prices,
                name="default",
                pools=self._pools,
                detached=True,
            )
            return self.context

    def on_error(self, policy_file: PolicyFile, error: PolicyFileError) -> None:
        print(f"veronica-otel: ERROR: {error}; keeping the last good policy", file=sys.stderr)
