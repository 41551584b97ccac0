"""Reading and validating a declarative policy file (TOML, or YAML with PyYAML).

Validation is strict so that every rule written in the file is enforced or
rejected: an unknown key, a value of the wrong type, NaN, an infinity, a
negative number, a bool where a number belongs, an empty rule, two keys that
name the same model, or a fallback that leads to another fallback raise
:class:`PolicyFileError` naming the file, the key path (for example
``models."gpt-4o".max_tokens``) and the value. Nothing is silently dropped.
"""

from __future__ import annotations

import importlib
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ._config import ExecutionConfig
from ._pools import check_pool_name, pool_limits
from ._pricing import UnitPrices
from ._unit_prices import UNITS, per_request_prices, per_unit_prices
from ._units import check_count, check_usd

__all__ = [
    "ModelRule",
    "PolicyFileError",
    "PoolRule",
    "PolicySpec",
    "ToolRule",
    "load_policy",
    "parse_policy",
]

MAX_FILE_BYTES = 1 << 20  # a policy is a few kilobytes; more is a mistake
MAX_NESTING = 64  # brackets and braces open at once; a policy needs a handful
_NO_VALUE = object()
_SHOWN = 120  # longest value repr in a message
_TOP_KEYS = (
    "unknown_model_price_usd_per_mtok",
    "limits",
    "prices",
    "models",
    "tools",
    "agents",
    "pools",
)
_LIMIT_KEYS = tuple(f.name for f in fields(ExecutionConfig))
_PRICE_KEYS = ("input", "output", "cached_input", "reasoning", "cache_write")
_UNIT_PRICE_KEYS = tuple(UNITS)  # per_image, per_character, per_second, per_request
_MODEL_KEYS = ("fallback", "max_tokens", "max_calls")
_TOOL_KEYS = ("max_calls", "cost_usd")
_POOL_KEYS = ("max_cost_usd", "max_steps", "max_tokens", "window")
# An agent's limits add up across its entries (see veronica_otel.agent).
_AGENT_KEYS = ("max_cost_usd", "max_steps", "max_tokens", "max_retries_total", "max_repeats")


class PolicyFileError(ValueError):
    """A policy file that cannot be read or breaks a rule of the format.

    Attributes:
        path: The file.
        key: The key path of the offending value (``models."gpt-4o".max_tokens``),
            or None when the problem is the file as a whole.
        value: The offending value (absent when ``key`` is None).
        problem: What is wrong, in a sentence fragment.
        variable: The environment variable that named the file
            (``VERONICA_POLICY_FILE``), or None.
    """

    def __init__(
        self,
        path: str,
        problem: str,
        key: str | None = None,
        value: object = _NO_VALUE,
        variable: str | None = None,
    ) -> None:
        self.path = path
        self.key = key
        self.value = None if value is _NO_VALUE else value
        self.problem = problem
        self.variable = variable
        self._has_value = value is not _NO_VALUE
        problem, key = _cut(problem, 3 * _SHOWN), key and _cut(key, 3 * _SHOWN)
        where = f"policy file {path}" + (f" ({variable})" if variable else "")
        if key is None:
            message = f"{where}: {problem}"
        elif value is _NO_VALUE:
            message = f"{where}: {key}: {problem}"
        else:
            message = f"{where}: {key} = {_shown(value)}: {problem}"
        super().__init__(message)

    def from_variable(self, variable: str) -> PolicyFileError:
        """The same error, saying that ``variable`` named the file."""
        value = self.value if self._has_value else _NO_VALUE
        return PolicyFileError(self.path, self.problem, self.key, value, variable)

    def __reduce__(self) -> tuple[Any, ...]:
        # The "no value" marker does not survive pickling: send a flag instead.
        return (
            _unpickle_error,
            (self.path, self.problem, self.key, self.value, self._has_value, self.variable),
        )


def _unpickle_error(
    path: str, problem: str, key: str | None, value: object, has_value: bool, variable: str | None
) -> PolicyFileError:
    return PolicyFileError(path, problem, key, value if has_value else _NO_VALUE, variable)


def _shown(value: object) -> str:
    """``repr(value)``, shortened: a hostile file's value may be huge (or not printable)."""
    try:
        text = repr(value)
    except Exception:  # an int past the conversion limit, for one
        return f"<{type(value).__name__} too large to show>"
    return _cut(text)


def _cut(text: str, limit: int = _SHOWN) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


@dataclass(frozen=True, slots=True)
class ModelRule:
    """The rules of one ``[models."name"]`` table.

    Attributes:
        key: The table's name, lower-cased (``"gpt-4o"`` or ``"openai:gpt-4o"``).
        path: Its key path in the file, for messages (``models."gpt-4o"``).
        fallback: Send this model instead.
        max_tokens: Clamp each call's output tokens to this.
        max_calls: At most this many calls per chain.
    """

    key: str
    path: str
    fallback: str | None = None
    max_tokens: int | None = None
    max_calls: int | None = None


@dataclass(frozen=True, slots=True)
class ToolRule:
    """The rules of one ``[tools."name"]`` table (at least one is set).

    Attributes:
        name: The tool's name, exactly as the call reports it.
        path: Its key path in the file (``tools."web_search"``).
        max_calls: At most this many calls per chain.
        cost_usd: What one call of the tool costs (finite, >= 0), reserved
            before and committed after each call that gives no cost of its own.
    """

    name: str
    path: str
    max_calls: int | None = None
    cost_usd: float | None = None


@dataclass(frozen=True, slots=True)
class PoolRule:
    """The limits of one ``[pools."name"]`` table (see :class:`~veronica_otel.BudgetPool`).

    Attributes:
        name: The pool's name, exactly (``"tenant:acme"``).
        path: Its key path in the file (``pools."tenant:acme"``).
        max_cost_usd: Ceiling on the cost committed within the window.
        max_steps: Ceiling on the calls within the window.
        max_tokens: Ceiling on the tokens within the window.
        window: The rolling window as written (``"1d"`` or seconds); None: lifetime.
    """

    name: str
    path: str
    max_cost_usd: float | None = None
    max_steps: int | None = None
    max_tokens: int | None = None
    window: str | float | None = None


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """One validated version of a policy file.

    Attributes:
        limits: Default chain limits; a field left ``None`` was not set.
        prices: Unit prices keyed like :class:`PriceTable` keys, lower-cased.
        unknown_model_price_usd_per_mtok: Price of a model nobody prices.
        models: Per-model rules keyed by lower-cased ``"model"`` or
            ``"provider:model"``.
        tools: Per-tool rules keyed by tool name.
        aliases: Model names mapped to the model whose price they take
            (``[models] "my-gpt4o-deploy" = "gpt-4o"``), keyed lower-cased.
            Pricing only: a rule for ``gpt-4o`` does not apply to the alias.
        pools: Budget pool limits keyed by pool name.
        agents: Per-agent limits (``[agents."researcher"]``) keyed by agent
            name, exactly: what an agent of that name may use in one chain.
    """

    limits: ExecutionConfig = field(default_factory=ExecutionConfig)
    prices: Mapping[str, UnitPrices] = field(default_factory=dict)
    unknown_model_price_usd_per_mtok: float | None = None
    models: Mapping[str, ModelRule] = field(default_factory=dict)
    tools: Mapping[str, ToolRule] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)
    pools: Mapping[str, PoolRule] = field(default_factory=dict)
    agents: Mapping[str, ExecutionConfig] = field(default_factory=dict)


def load_policy(path: Path) -> PolicySpec:
    """Read, parse and validate the policy file at ``path``.

    Raises:
        PolicyFileError: The file cannot be read, parsed or validated.
    """
    source = str(path)
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml"):
        raise PolicyFileError(source, "has an unknown extension (use .toml, .yaml or .yml)")
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise PolicyFileError(source, f"cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:  # a path no file can have (a NUL byte)
        raise PolicyFileError(source, f"cannot be read ({exc})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise PolicyFileError(source, f"is larger than {MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyFileError(source, f"is not UTF-8 ({exc})") from None
    _check_nesting(source, text)
    try:
        data = _parse_yaml(source, text) if suffix != ".toml" else _parse_toml(source, text)
        return parse_policy(data, source)
    except PolicyFileError:
        raise
    except Exception as exc:
        # A hostile file: nesting deep enough for RecursionError, an integer past
        # the conversion limit (ValueError), ... Always the file's error, named.
        raise PolicyFileError(source, f"cannot be loaded ({_describe(exc)})") from None


# What holds a bracket that does not nest: a string (TOML's and YAML's quoted
# forms) or a comment; else the brackets and braces themselves.
_BRACKETS = re.compile(
    r"""
      \"\"\"[\s\S]*?\"\"\" | \'\'\'[\s\S]*?\'\'\'  # multi-line strings (TOML)
    | "(?:[^"\\\n]|\\.)*"            # basic / double-quoted, with escapes
    | '(?:[^']|'')*'                  # literal / single-quoted ('' is a quote in YAML)
    | \#[^\n]*                         # a comment
    | [\[\]{}]
    """,
    re.VERBOSE,
)


def _check_nesting(source: str, text: str) -> None:
    """Refuse a file whose brackets nest past :data:`MAX_NESTING`, before parsing it.

    Both parsers recurse per level: a hostile file of 100,000 ``[`` took
    PyYAML seconds to scan before it ended in RecursionError (still caught in
    :func:`load_policy`, for what this does not count: YAML's block nesting).
    """
    depth = 0
    for match in _BRACKETS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > MAX_NESTING:
                line = text.count("\n", 0, match.start()) + 1
                raise PolicyFileError(
                    source,
                    f"is nested too deeply (over {MAX_NESTING} levels of [ and {{, line {line})",
                )
        elif token in ("]", "}"):
            depth = max(depth - 1, 0)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "RecursionError: nested too deeply"
    text = str(exc)
    if isinstance(exc, ValueError) and "integer string conversion" in text:
        return "ValueError: an integer with too many digits"
    return f"{type(exc).__name__}: {_cut(text)}" if text else type(exc).__name__


def _parse_toml(source: str, text: str) -> object:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyFileError(source, f"is not valid TOML ({exc})") from None


def _parse_yaml(source: str, text: str) -> object:
    try:
        yaml: Any = importlib.import_module("yaml")
    except ImportError:
        raise PolicyFileError(
            source, "is YAML, which needs PyYAML (pip install pyyaml), or use a .toml file"
        ) from None
    loader: Any = type("_StrictSafeLoader", (yaml.SafeLoader,), {})

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        # PyYAML keeps the last of two equal keys: a rule silently dropped.
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                continue  # PyYAML itself rejects unhashable keys
            if key in seen:
                line = key_node.start_mark.line + 1
                raise PolicyFileError(source, f"is defined twice (line {line})", key=str(key))
            seen.add(key)
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    try:
        return yaml.load(text, Loader=loader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        raise PolicyFileError(source, f"is not valid YAML ({exc})") from None


def parse_policy(data: object, source: str = "<policy>") -> PolicySpec:
    """Validate a parsed document (a mapping) into a :class:`PolicySpec`.

    Raises:
        PolicyFileError: A key or value breaks the format; ``source`` names
            the file in the message.
    """
    if data is None:  # an empty YAML document
        data = {}
    top = _table(source, "", data, _TOP_KEYS, allow_empty=True)
    unknown_price = None
    if "unknown_model_price_usd_per_mtok" in top:
        unknown_price = _usd(source, "unknown_model_price_usd_per_mtok", top[_TOP_KEYS[0]])
    models, aliases = _models(source, top.get("models", {}))
    return PolicySpec(
        limits=_limits(source, top.get("limits", {})),
        prices=_prices(source, top.get("prices", {})),
        unknown_model_price_usd_per_mtok=unknown_price,
        models=models,
        tools=_tools(source, top.get("tools", {})),
        aliases=aliases,
        pools=_pools(source, top.get("pools", {})),
        agents=_agents(source, top.get("agents", {})),
    )


def _limits(source: str, data: object) -> ExecutionConfig:
    table = _table(source, "limits", data, _LIMIT_KEYS, allow_empty=True)
    values: dict[str, Any] = {}
    for name, value in table.items():
        path = f"limits.{name}"
        if name == "reservation_wait_s":  # seconds: its own checks name it
            number: Any = value
        else:
            number = (
                _usd(source, path, value) if name == "max_cost_usd" else _count(source, path, value)
            )
        try:
            ExecutionConfig(**{name: number})  # its own range rules
        except (TypeError, ValueError) as exc:
            raise PolicyFileError(source, _problem(exc, name), path, value) from None
        values[name] = number
    return ExecutionConfig(**values)


def _prices(source: str, data: object) -> dict[str, UnitPrices]:
    prices: dict[str, UnitPrices] = {}
    names: dict[str, str] = {}
    for name, body in _named_tables(source, "prices", data).items():
        path = f"prices.{_quote(name)}"
        table = dict(_table(source, path, body, _PRICE_KEYS + _UNIT_PRICE_KEYS))
        key = _unique(source, "prices", name, names)
        units = {k: table.pop(k) for k in UNITS if k in table}
        for unit, value in units.items():  # "dall-e-3" per_image: the key "dall-e-3#image"
            prices[f"{key}#{UNITS[unit]}"] = _unit_price(source, f"{path}.{unit}", unit, value)
        if units and not table:
            continue  # an endpoint priced per unit only (images, a job's bound)
        for required in ("input", "output"):
            if required not in table:
                raise PolicyFileError(source, f"is required in {path}", f"{path}.{required}")
        usd = {k: _price(source, f"{path}.{k}", v) for k, v in table.items()}
        prices[key] = UnitPrices.from_usd_per_mtok(**usd)
    return prices


def _unit_price(source: str, path: str, unit: str, value: object) -> UnitPrices:
    usd = _usd(source, path, value)
    try:
        if unit == "per_request":
            return per_request_prices(usd, unit)
        return per_unit_prices(usd, unit)
    except ValueError as exc:
        raise PolicyFileError(source, _problem(exc, unit), path, value) from None


def _models(source: str, data: object) -> tuple[dict[str, ModelRule], dict[str, str]]:
    rules: dict[str, ModelRule] = {}
    aliases: dict[str, str] = {}
    names: dict[str, str] = {}
    for name, body in _named_tables(source, "models", data).items():
        path = f"models.{_quote(name)}"
        if isinstance(body, str):  # "my-gpt4o-deploy" = "gpt-4o": an alias, priced as its model
            target = _name(source, path, body)
            if name.lower() == target.lower():
                raise PolicyFileError(source, "is an alias of itself", path, body)
            aliases[_unique(source, "models", name, names)] = target
            continue
        if not isinstance(body, Mapping):
            raise PolicyFileError(
                source,
                f"must be a table of rules, or a model name (an alias), got {type(body).__name__}",
                path,
                body,
            )
        table = _table(source, path, body, _MODEL_KEYS)
        fallback = None
        if "fallback" in table:
            fallback = _name(source, f"{path}.fallback", table["fallback"])
            if _same_model(name.lower(), fallback.lower()):
                raise PolicyFileError(
                    source, "falls back to the model itself", f"{path}.fallback", fallback
                )
        max_tokens = None
        if "max_tokens" in table:
            max_tokens = _count(source, f"{path}.max_tokens", table["max_tokens"], minimum=1)
        max_calls = None
        if "max_calls" in table:
            max_calls = _count(source, f"{path}.max_calls", table["max_calls"])
        key = _unique(source, "models", name, names)
        rules[key] = ModelRule(key, path, fallback, max_tokens, max_calls)
    _check_fallbacks(source, rules)
    for key, target in aliases.items():
        if target.lower() in aliases:
            raise PolicyFileError(
                source,
                "is an alias of another alias; name the model directly",
                f"models.{_quote(names[key])}",
                target,
            )
    return rules, aliases


def _check_fallbacks(source: str, rules: Mapping[str, ModelRule]) -> None:
    # A fallback is applied once: a target that falls back again would be a
    # rule that never runs, so chains are refused (point the first at the last).
    for rule in rules.values():
        if rule.fallback is None:
            continue
        target = rule.fallback.lower()
        for other in rules.values():
            if other.fallback is not None and _same_model(other.key, target):
                raise PolicyFileError(
                    source,
                    f"falls back to a model that falls back again ({other.path}.fallback = "
                    f"{other.fallback!r}); name the final model directly",
                    f"{rule.path}.fallback",
                    rule.fallback,
                )


def _same_model(key: str, model: str) -> bool:
    """Whether rule key ``key`` (``model`` or ``provider:model``) names ``model``."""
    return key == model or key.endswith(":" + model)


def _tools(source: str, data: object) -> dict[str, ToolRule]:
    rules: dict[str, ToolRule] = {}
    for name, body in _named_tables(source, "tools", data).items():
        path = f"tools.{_quote(name)}"
        table = _table(source, path, body, _TOOL_KEYS)
        max_calls = None
        if "max_calls" in table:
            max_calls = _count(source, f"{path}.max_calls", table["max_calls"])
        cost_usd = None
        if "cost_usd" in table:
            cost_usd = _usd(source, f"{path}.cost_usd", table["cost_usd"])
        rules[name] = ToolRule(name, path, max_calls, cost_usd)
    return rules


def _pools(source: str, data: object) -> dict[str, PoolRule]:
    rules: dict[str, PoolRule] = {}
    for name, body in _named_tables(source, "pools", data).items():
        path = f"pools.{_quote(name)}"
        try:
            check_pool_name(name)
        except ValueError as exc:
            raise PolicyFileError(source, _problem(exc, "name"), path) from None
        table = _table(source, path, body, _POOL_KEYS)
        cost = None
        if "max_cost_usd" in table:
            cost = _usd(source, f"{path}.max_cost_usd", table["max_cost_usd"])
        steps = (
            _count(source, f"{path}.max_steps", table["max_steps"])
            if "max_steps" in table
            else None
        )
        tokens = (
            _count(source, f"{path}.max_tokens", table["max_tokens"])
            if "max_tokens" in table
            else None
        )
        window = table.get("window")
        if window is not None:
            if isinstance(window, bool) or not isinstance(window, (str, int, float)):
                raise PolicyFileError(
                    source,
                    f"must be a duration string or seconds, got {type(window).__name__}",
                    f"{path}.window",
                    window,
                )
            try:
                pool_limits(name, None, None, None, window)
            except ValueError as exc:
                raise PolicyFileError(
                    source, _problem(exc, "window"), f"{path}.window", window
                ) from None
        if cost is None and steps is None and tokens is None:
            raise PolicyFileError(
                source, "sets no limit (expected max_cost_usd, max_steps or max_tokens)", path
            )
        rules[name] = PoolRule(name, path, cost, steps, tokens, window)
    return rules


def _agents(source: str, data: object) -> dict[str, ExecutionConfig]:
    agents: dict[str, ExecutionConfig] = {}
    for name, body in _named_tables(source, "agents", data).items():
        path = f"agents.{_quote(name)}"
        if len(name) > 256:
            raise PolicyFileError(source, "is longer than 256 characters", path)
        table = _table(source, path, body, _AGENT_KEYS)
        values: dict[str, Any] = {}
        for key, value in table.items():
            where = f"{path}.{key}"
            number = _usd if key == "max_cost_usd" else _count
            values[key] = number(source, where, value)
            try:
                ExecutionConfig(**{key: values[key]})  # its own range rules
            except ValueError as exc:
                raise PolicyFileError(source, _problem(exc, key), where, value) from None
        agents[name] = ExecutionConfig(**values)
    return agents


# -- value checks ------------------------------------------------------------------


def _table(
    source: str,
    path: str,
    data: object,
    allowed: tuple[str, ...],
    *,
    allow_empty: bool = False,
) -> Mapping[str, object]:
    where = path or "the top level"
    if not isinstance(data, Mapping):
        raise PolicyFileError(source, f"must be a table, got {type(data).__name__}", where, data)
    for key in data:
        if not isinstance(key, str):
            raise PolicyFileError(source, f"has a key that is not a string: {key!r}", where)
        if key not in allowed:
            full = f"{path}.{key}" if path else key
            raise PolicyFileError(
                source, f"is not a known key (expected one of: {', '.join(allowed)})", full
            )
    if not data and not allow_empty:
        raise PolicyFileError(source, f"has no rules (expected one of: {', '.join(allowed)})", path)
    return data


def _named_tables(source: str, section: str, data: object) -> Mapping[str, object]:
    if not isinstance(data, Mapping):
        raise PolicyFileError(source, f"must be a table, got {type(data).__name__}", section, data)
    for key in data:
        if not isinstance(key, str):
            raise PolicyFileError(source, f"has a name that is not a string: {key!r}", section)
        _name(source, f"{section}.{_quote(key)}", key, what="name")
    return data


def _unique(source: str, section: str, name: str, seen: dict[str, str]) -> str:
    key = name.lower()
    if key in seen:
        raise PolicyFileError(
            source,
            f"names the same model as {section}.{_quote(seen[key])} (names ignore case)",
            f"{section}.{_quote(name)}",
        )
    seen[key] = name
    return key


def _name(source: str, path: str, value: object, what: str = "value") -> str:
    if not isinstance(value, str):
        raise PolicyFileError(source, f"must be a string, got {type(value).__name__}", path, value)
    if not value or value != value.strip():
        raise PolicyFileError(
            source, f"must be a non-empty {what} without surrounding spaces", path, value
        )
    return value


def _count(source: str, path: str, value: object, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyFileError(
            source, f"must be a whole number, got {type(value).__name__}", path, value
        )
    try:
        number = check_count(path, value)
    except ValueError as exc:
        raise PolicyFileError(source, _problem(exc, path), path, value) from None
    if number < minimum:
        raise PolicyFileError(source, f"must be >= {minimum}", path, value)
    return number


def _usd(source: str, path: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyFileError(
            source, f"must be a number of USD, got {type(value).__name__}", path, value
        )
    try:
        return check_usd(path, value)
    except ValueError as exc:
        raise PolicyFileError(source, _problem(exc, path), path, value) from None


def _price(source: str, path: str, value: object) -> float:
    usd = _usd(source, path, value)
    try:
        UnitPrices.from_usd_per_mtok(usd, usd)  # in range once counted in nano-USD
    except ValueError as exc:
        raise PolicyFileError(source, _problem(exc, "UnitPrices.input"), path, value) from None
    return usd


def _problem(exc: Exception, path: str) -> str:
    return str(exc).removeprefix(path).strip()


def _quote(name: str) -> str:
    """A name as a TOML key: always quoted, so ``gpt-4o`` and ``a.b`` read the same."""
    return json.dumps(name, ensure_ascii=False)
