"""Unit prices per model, resolved once, then priced with integer arithmetic.

Prices come from the offline table bundled in the ``genai-prices`` wheel (never
its network updater). A lookup there is slow (about 100 us), so
:class:`PriceTable` resolves each ``(provider, model)`` once into
:class:`UnitPrices`, integers in nano-USD per million tokens, and caches it.

Token counts follow OpenAI's usage and ``genai-prices``: ``input_tokens`` is
the *whole* prompt, cache reads and cache writes included, and
``output_tokens`` includes reasoning tokens. (Anthropic reports
``input_tokens`` without its cache tokens: add them before pricing.)

Input-token bound (:data:`INPUT_TOKEN_BOUND`): without a local tokenizer a
reservation counts one token per UTF-8 byte. Byte-level BPE tokenizers
(OpenAI's tiktoken, Anthropic's) and SentencePiece with byte fallback (Gemini)
never emit a text token shorter than one byte, so tokens <= bytes. Chat framing
adds tokens that are not in the text: OpenAI documents 3 per message plus the
role (1 token), hence :data:`TOKENS_PER_MESSAGE` = 4, and 3 per request that
prime the reply (:data:`TOKENS_PER_REQUEST`). Images, audio, tool schemas
rendered by the provider and provider-injected system prompts (Anthropic's
tool-use prompt) are not covered: count them separately.

Output limits: a call sent without an output cap is clamped (by the
instrumentors) to what the budget buys, but never to more than the model can
produce: :meth:`UnitPrices.output_limit`, the model's largest output
(:data:`MAX_OUTPUT_TOKENS`, from the providers' model pages; else
:data:`DEFAULT_MAX_OUTPUT_TOKENS`) and at most its context window
(``genai-prices``) less the input bound. So one uncapped call never reserves
the whole remaining budget for output its model could never return.

Model names as deployments spell them: a name no price matches as sent is
retried in its canonical form (:func:`canonical_model_name`): Bedrock ids
(``anthropic.claude-3-5-sonnet-20241022-v2:0``, cross-region ``us.``/``eu.``/
``apac.``/``global.`` prefixes, inference-profile ARNs) and Vertex ids
(``claude-3-5-sonnet-v2@20241022``) price as ``claude-3-5-sonnet-20241022``.
Names only the deployment knows (Azure deployment names) are mapped by aliases:
``VERONICA_MODEL_ALIASES="my-gpt4o-deploy=gpt-4o"`` or a policy file's
``[models] "my-gpt4o-deploy" = "gpt-4o"``. All of it runs once per
``(provider, model)``; later calls are a dict hit.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal, localcontext
from typing import TYPE_CHECKING, Any, cast

from veronica_otel._units import MAX_COUNT, NANO_PER_USD, check_count, check_usd, usd_to_nano

from ._fork import remake_locks_after_fork

if TYPE_CHECKING:
    from genai_prices.data_snapshot import DataSnapshot
    from genai_prices.types import ModelInfo, ModelPrice, Provider

__all__ = [
    "UnitPrices",
    "PriceTable",
    "default_price_table",
    "UNKNOWN_MODEL_PRICE_ENV",
    "MODEL_ALIASES_ENV",
    "canonical_model_name",
    "parse_model_aliases",
    "TOKENS_PER_MESSAGE",
    "TOKENS_PER_REQUEST",
    "INPUT_TOKEN_BOUND",
    "estimate_input_tokens",
    "estimate_input_tokens_from_bytes",
    "MAX_OUTPUT_TOKENS",
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "max_output_tokens",
]

UNKNOWN_MODEL_PRICE_ENV = "VERONICA_UNKNOWN_MODEL_PRICE"
MODEL_ALIASES_ENV = "VERONICA_MODEL_ALIASES"
TOKENS_PER_MESSAGE = 4
TOKENS_PER_REQUEST = 3
INPUT_TOKEN_BOUND = "utf8_bytes + 4 per message + 3 per request"
"""How :func:`estimate_input_tokens` bounds a prompt (see the module docstring)."""

# The largest output (max_tokens / max_completion_tokens) each model accepts
# per call, as OpenAI's (platform.openai.com/docs/models), Anthropic's
# (docs.anthropic.com/en/docs/about-claude/models) and Google's model pages state it. Kept
# small: common chat models whose limit we could check. The longest matching
# name wins; a dated snapshot (``-2024-08-06``, ``-20241022``) or ``-latest``
# matches its base name.
MAX_OUTPUT_TOKENS: Mapping[str, int] = {
    "gpt-3.5-turbo": 4_096,
    "gpt-4": 8_192,
    "gpt-4-turbo": 4_096,
    "gpt-4o": 16_384,
    "gpt-4o-2024-05-13": 4_096,
    "gpt-4o-mini": 16_384,
    "chatgpt-4o": 16_384,
    "gpt-4.1": 32_768,
    "gpt-4.1-mini": 32_768,
    "gpt-4.1-nano": 32_768,
    "gpt-5": 128_000,
    "gpt-5-mini": 128_000,
    "gpt-5-nano": 128_000,
    # Realtime responses: max_output_tokens 1-4096 (OpenAI API reference, realtime)
    "gpt-realtime": 4_096,
    "gpt-realtime-mini": 4_096,
    "gpt-4o-realtime-preview": 4_096,
    "gpt-4o-mini-realtime-preview": 4_096,
    "o1": 100_000,
    "o1-mini": 65_536,
    "o3": 100_000,
    "o3-mini": 100_000,
    "o4-mini": 100_000,
    "claude-3-haiku": 4_096,
    "claude-3-opus": 4_096,
    "claude-3-5-haiku": 8_192,
    "claude-3-5-sonnet": 8_192,
    "claude-3-7-sonnet": 64_000,
    "claude-sonnet-4": 64_000,
    "claude-sonnet-4-0": 64_000,
    "claude-opus-4": 32_000,
    "claude-opus-4-0": 32_000,
    "claude-opus-4-1": 32_000,
    "claude-sonnet-4-5": 64_000,
    "claude-haiku-4-5": 64_000,
    "claude-opus-4-5": 64_000,
    # ai.google.dev/gemini-api/docs/models ("Output token limit"; thinking counts in it)
    "gemini-1.5-flash": 8_192,
    "gemini-1.5-pro": 8_192,
    "gemini-2.0-flash": 8_192,
    "gemini-2.0-flash-lite": 8_192,
    "gemini-2.5-flash": 65_536,
    "gemini-2.5-flash-lite": 65_536,
    "gemini-2.5-pro": 65_536,
}
DEFAULT_MAX_OUTPUT_TOKENS = 32_768
"""Output limit of a model not in :data:`MAX_OUTPUT_TOKENS`: an uncapped call to
it is clamped to at most this many output tokens (pass ``max_tokens`` to ask
for more). It keeps one uncapped call from reserving a whole budget."""

_PER_MTOK = 1_000_000
_MAX_CACHED = 10_000  # distinct (provider, model) keys; past it, resolve without caching
_MISS = object()
_COUNT_NAMES = (
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "reasoning_tokens",
    "cache_write_tokens",
)


@dataclass(frozen=True, slots=True)
class UnitPrices:
    """Integer prices in nano-USD per one million tokens.

    Attributes:
        input: Price of an uncached input token.
        output: Price of an output token.
        cached_input: Price of a cache-read input token.
        reasoning: Price of a reasoning token.
        cache_write: Price of a cache-write input token; ``None`` (set to
            ``input``) when the provider charges no more than input for it.
        tiers: Context-size tiers ``(threshold, prices)``, ascending: ``prices``
            (without tiers of its own) applies to *every* token of a call whose
            ``input_tokens`` exceeds ``threshold``, as providers bill them.
        max_output: The model's largest output per call, when known
            (prices from ``genai-prices`` carry it from :data:`MAX_OUTPUT_TOKENS`;
            set it on your own prices, else :data:`DEFAULT_MAX_OUTPUT_TOKENS`
            applies).
        context_window: The model's context window, when known (from
            ``genai-prices``, for the models it prices). Neither is compared:
            they describe the model, not its price.
    """

    input: int
    output: int
    cached_input: int
    reasoning: int
    cache_write: int | None = None
    tiers: tuple[tuple[int, UnitPrices], ...] = ()
    max_output: int | None = field(default=None, compare=False)
    context_window: int | None = field(default=None, compare=False)
    # (threshold, input, output, cached_input, reasoning, cache_write), base first at -1
    _segments: tuple[tuple[int, int, int, int, int, int], ...] = field(
        init=False, repr=False, compare=False
    )
    # (threshold, worst input price, worst output price, worst input price with
    # no cache write) over tiers reachable so far
    _worst: tuple[tuple[int, int, int, int], ...] = field(init=False, repr=False, compare=False)
    # (input, output) prices when there are no tiers (most models), else None
    _plain: tuple[int, int] | None = field(init=False, repr=False, compare=False)
    # (worst input price, worst input price with no cache write, worst output
    # price) when there are no tiers, else None: max_cost_nano's one price
    # pair, read by admission's hot path without the method's frame
    _untiered: tuple[int, int, int] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.cache_write is None:  # normalised, so equal prices compare equal
            object.__setattr__(self, "cache_write", self.input)
        segments = [(-1, *self._flat("UnitPrices"))]
        for i, tier in enumerate(self.tiers):
            name = f"UnitPrices.tiers[{i}]"
            if not isinstance(tier, tuple) or len(tier) != 2 or not isinstance(tier[1], UnitPrices):
                raise TypeError(f"{name} must be a (threshold, UnitPrices) pair, got {tier!r}")
            threshold = check_count(f"{name} threshold", tier[0])
            if tier[1].tiers or threshold <= segments[-1][0]:
                raise ValueError(f"{name} must have no tiers and an ascending threshold")
            segments.append((threshold, *tier[1]._flat(name)))
        worst, wi, wo, wr = [], 0, 0, 0
        for threshold, pi, po, pc, pr, pw in segments:
            wi, wo, wr = max(wi, pi, pc, pw), max(wo, po, pr), max(wr, pi, pc)
            worst.append((threshold, wi, wo, wr))
        object.__setattr__(self, "_segments", tuple(segments))
        object.__setattr__(self, "_worst", tuple(worst))
        plain = (segments[0][1], segments[0][2]) if len(segments) == 1 else None
        object.__setattr__(self, "_plain", plain)
        top = worst[0]
        object.__setattr__(self, "_untiered", (top[1], top[3], top[2]) if plain else None)

    def output_limit(self, input_tokens: int) -> int:
        """The most output tokens one call with ``input_tokens`` of input can produce.

        The model's :attr:`max_output` (else :data:`DEFAULT_MAX_OUTPUT_TOKENS`),
        and no more than its :attr:`context_window` leaves after the input.
        """
        limit = DEFAULT_MAX_OUTPUT_TOKENS if self.max_output is None else self.max_output
        if self.context_window is not None:
            limit = min(limit, max(0, self.context_window - input_tokens))
        return limit

    def _flat(self, name: str) -> tuple[int, int, int, int, int]:
        prices = [self.input, self.output, self.cached_input, self.reasoning, self.cache_write]
        keys = ("input", "output", "cached_input", "reasoning", "cache_write")
        a, b, c, d, e = (check_count(f"{name}.{k}", p) for k, p in zip(keys, prices, strict=True))
        return a, b, c, d, e

    @classmethod
    def from_usd_per_mtok(
        cls,
        input: float,
        output: float,
        cached_input: float | None = None,
        reasoning: float | None = None,
        cache_write: float | None = None,
    ) -> UnitPrices:
        """Build prices from USD per million tokens, e.g. ``(0.15, 0.6)``.

        ``cached_input`` and ``cache_write`` default to ``input``; ``reasoning``
        to ``output``. Each value is validated and named in any error.
        """
        i = usd_to_nano(check_usd("input", input))
        o = usd_to_nano(check_usd("output", output))

        def opt(name: str, value: float | None, default: int) -> int:
            return default if value is None else usd_to_nano(check_usd(name, value))

        c, r = opt("cached_input", cached_input, i), opt("reasoning", reasoning, o)
        return cls(i, o, c, r, opt("cache_write", cache_write, i))

    def cost_nano(
        self,
        input_tokens: int,
        output_tokens: int,
        cached_input_tokens: int = 0,
        reasoning_tokens: int = 0,
        *,
        cache_write_tokens: int = 0,
    ) -> int:
        """Return the cost of a call in nano-USD, rounded up.

        ``cached_input_tokens`` and ``cache_write_tokens`` are part of
        ``input_tokens``; ``reasoning_tokens`` are part of ``output_tokens``.

        Raises:
            TypeError: A count is not an int.
            ValueError: A count is negative, absurd, or a part exceeds its whole.
        """
        i, o, c = input_tokens, output_tokens, cached_input_tokens
        r, w = reasoning_tokens, cache_write_tokens
        if not (  # fast path for plain ints in range; else check_count names the culprit
            type(i) is type(o) is type(c) is type(r) is type(w) is int
            and 0 <= i <= MAX_COUNT
            and 0 <= o <= MAX_COUNT
            and c | r | w >= 0  # an int's bitwise or is negative iff one of them is
        ):
            counts = zip(_COUNT_NAMES, (i, o, c, r, w), strict=True)
            i, o, c, r, w = (check_count(name, value) for name, value in counts)
        if c + w > i:
            raise ValueError(
                f"cached_input_tokens + cache_write_tokens ({c} + {w}) "
                f"must be <= input_tokens ({i})"
            )
        if r > o:
            raise ValueError(f"reasoning_tokens ({r}) must be <= output_tokens ({o})")
        return self.cost_nano_unchecked(i, o, c, r, w)

    def cost_nano_unchecked(self, i: int, o: int, c: int, r: int, w: int) -> int:
        """:meth:`cost_nano` for counts the caller already validated.

        For hot paths that produce the counts themselves: ints in
        ``[0, MAX_COUNT]`` with ``c + w <= i`` and ``r <= o`` (input, output,
        cached input, reasoning, cache write). Anything else is a caller bug.
        """
        segments = self._segments
        segment = segments[0]
        if len(segments) > 1:
            for candidate in segments:
                if i <= candidate[0]:
                    break
                segment = candidate
        _, pi, po, pc, pr, pw = segment
        total = (i - c - w) * pi + c * pc + w * pw + (o - r) * po + r * pr
        return -(-total // _PER_MTOK)

    def plain_cost_nano(self, i: int, o: int) -> int:
        """:meth:`cost_nano_unchecked` of ``i`` input and ``o`` output tokens, none of
        them cached, reasoning or cache writes (a settled call's common case)."""
        plain = self._plain
        if plain is None:
            return self.cost_nano_unchecked(i, o, 0, 0, 0)
        return -(-(i * plain[0] + o * plain[1]) // _PER_MTOK)

    def _worst_prices(self, input_tokens: int, cache_writes: bool = True) -> tuple[int, int]:
        worst = self._worst
        _, wi, wo, wr = worst[-1]
        if len(worst) > 1 and input_tokens <= worst[-1][0]:
            for threshold, ti, to, tr in worst:
                if input_tokens <= threshold:
                    break
                wi, wo, wr = ti, to, tr
        return (wi if cache_writes else wr), wo

    def max_cost_nano(
        self, input_tokens: int, output_tokens: int, cache_writes: bool = True
    ) -> int:
        """Return the worst-case cost of a call, for a reservation.

        Every input token is priced at the dearest input-side price (uncached,
        cache read, or cache write unless ``cache_writes`` is False: the
        request marks nothing to cache) and every output token at the dearest
        of output and reasoning, in the most expensive tier ``input_tokens``
        can reach. Tiers depend on input tokens only, so when ``input_tokens``
        is an upper bound no cheaper prompt can land in a dearer tier.
        """
        i, o = input_tokens, output_tokens
        if not (type(i) is int and type(o) is int and 0 <= i <= MAX_COUNT and 0 <= o <= MAX_COUNT):
            i = check_count("input_tokens", i)
            o = check_count("output_tokens", o)
        worst = self._worst
        if len(worst) == 1:  # no tiers (most models): one price pair, no walk
            top = worst[0]
            wi, wo = (top[1] if cache_writes else top[3]), top[2]
        else:
            wi, wo = self._worst_prices(i, cache_writes)
        return -(-(i * wi + o * wo) // _PER_MTOK)

    def max_output_tokens_for(self, budget_nano: int, input_tokens: int) -> int:
        """Return how many output tokens ``budget_nano`` buys after the input.

        The result ``n`` is the largest with ``max_cost_nano(input_tokens, n) <=
        budget_nano``; 0 when the input alone does not fit, and ``MAX_COUNT``
        when output is free.
        """
        if isinstance(budget_nano, bool) or not isinstance(budget_nano, int):
            raise TypeError(f"budget_nano must be an int, got {type(budget_nano).__name__}")
        if budget_nano < 0:  # no MAX_COUNT cap: a budget may exceed 10**15 nano-USD
            raise ValueError(f"budget_nano must be >= 0, got {budget_nano!r}")
        budget = budget_nano
        i = check_count("input_tokens", input_tokens)
        wi, wo = self._worst_prices(i)
        room = budget * _PER_MTOK - i * wi
        if room < 0:
            return 0
        return MAX_COUNT if wo == 0 else min(room // wo, MAX_COUNT)


class PriceTable:
    """Resolves and caches :class:`UnitPrices` per ``(provider, model)``.

    Precedence: the user's ``prices`` for the model (key ``"provider:model"``,
    then ``"model"``, case-insensitive; as sent, then under its alias, then in
    its :func:`canonical_model_name` form: Bedrock and Vertex ids), then the
    user's provider-wide price (key ``"provider:*"``), then ``genai-prices``
    (the name as sent or aliased, then canonical), then the unknown-model
    price. A model with no known price resolves to ``None``, never to zero.
    ``aliases`` rename a model first (once: an alias's target is not looked
    up again as an alias).

    A provider-wide price covers every model the user did not price one by
    one, ahead of ``genai-prices``: ``{"ollama:*": UnitPrices(0, 0, 0, 0)}``
    makes a local server's models free, even one whose name ``genai-prices``
    would match to a hosted vendor's price (``deepseek-r1:7b``). It applies
    to that provider id only (as the instrumentor names it): a model without
    a provider matches no wildcard. Resolved once per ``(provider, model)``
    like any price.

    Args:
        prices: User prices keyed by ``"model"``, ``"provider:model"`` or
            ``"provider:*"``.
        aliases: Model names (Azure deployment names, say) mapped to the model
            whose price they take, ``{"my-gpt4o-deploy": "gpt-4o"}``;
            case-insensitive.
        unknown_model_price_usd_per_mtok: USD per million input and output
            tokens for any model with no known price.
    """

    def __init__(
        self,
        prices: Mapping[str, UnitPrices] | None = None,
        *,
        aliases: Mapping[str, str] | None = None,
        unknown_model_price_usd_per_mtok: float | None = None,
    ) -> None:
        self._user: dict[str, UnitPrices] = {}
        for key, value in (prices or {}).items():
            if not isinstance(key, str) or not key.strip():
                raise TypeError(f"prices keys must be non-empty str, got {key!r}")
            if not isinstance(value, UnitPrices):
                raise TypeError(f"prices[{key!r}] must be UnitPrices, got {type(value).__name__}")
            self._user[key.strip().lower()] = value
        self._aliases: dict[str, str] = {}
        for key, target in (aliases or {}).items():
            if not isinstance(key, str) or not key.strip():
                raise TypeError(f"aliases keys must be non-empty str, got {key!r}")
            if not isinstance(target, str) or not target.strip():
                raise TypeError(f"aliases[{key!r}] must be a non-empty str, got {target!r}")
            self._aliases[key.strip().lower()] = target.strip().lower()
        self._fallback: UnitPrices | None = None
        if unknown_model_price_usd_per_mtok is not None:
            usd = check_usd("unknown_model_price_usd_per_mtok", unknown_model_price_usd_per_mtok)
            self._fallback = UnitPrices.from_usd_per_mtok(usd, usd)
        self._cache: dict[tuple[object, ...], UnitPrices | None] = {}
        self._lock = threading.Lock()

    def lookup(
        self, provider: str | None, model: str, *, price_context: Mapping[str, str] | None = None
    ) -> UnitPrices | None:
        """Return the unit prices of ``model``, or ``None`` when unknown.

        Args:
            provider: A ``genai-prices`` provider id (``"openai"``,
                ``"anthropic"``, ``"google"``, ...) or OpenTelemetry
                ``gen_ai.provider.name``; ``None`` or an unknown id matches on
                the model name alone.
            model: The model name sent or returned, dated snapshots included.
            price_context: Request options that select a price variant, e.g.
                ``{"service_tier": "priority"}`` or ``{"processing": "batch"}``;
                without it the standard price applies.
        """
        key = (
            (provider, model, *sorted(price_context.items()))
            if price_context
            else (provider, model)
        )
        hit = self._cache.get(key, _MISS)
        if hit is not _MISS:
            return hit  # type: ignore[return-value]  # (before every call: no cast() call)
        with self._lock:
            hit = self._cache.get(key, _MISS)
            if hit is not _MISS:
                return cast("UnitPrices | None", hit)
            prices = self._resolve(provider, model, price_context)
            if prices is None and "#" not in model:  # a unit is never priced as tokens
                prices = self._fallback
            if len(self._cache) < _MAX_CACHED:
                self._cache[key] = prices
            return prices

    def _resolve(
        self, provider: str | None, model: str, context: Mapping[str, str] | None
    ) -> UnitPrices | None:
        if not isinstance(model, str):
            raise TypeError(f"model must be a str, got {type(model).__name__} {model!r}")
        if provider is not None and not isinstance(provider, str):
            raise TypeError(f"provider must be a str or None, got {type(provider).__name__}")
        name, prov = model.strip().lower(), (provider or "").strip().lower() or None
        if not name:
            return None
        if "#" in name:  # billed per unit (an image, a second): see _unit_prices
            from ._unit_prices import unit_prices

            return unit_prices(prov, name, self._user_prices, self._aliases)
        prices = self._user_prices(prov, name)
        if prices is not None:
            return prices
        name = self._aliases.get(name, name)
        canonical = canonical_model_name(name)
        prices = self._user_prices(prov, name)
        if prices is None and canonical != name:
            prices = self._user_prices(prov, canonical)
        if prices is None and prov is not None:
            prices = self._user.get(f"{prov}:*")  # the user's price for the whole provider
        if prices is None:
            prices = _from_genai_prices(prov, name, context)
        if prices is None and canonical != name:
            prices = _from_genai_prices(prov, canonical, context)
        return prices

    def _user_prices(self, provider: str | None, name: str) -> UnitPrices | None:
        user = self._user.get(f"{provider}:{name}") if provider else None
        return user or self._user.get(name)


_snapshot: DataSnapshot | None = None
_default_table: PriceTable | None = None
_module_lock = threading.Lock()
remake_locks_after_fork(sys.modules[__name__], "_module_lock")


def default_price_table() -> PriceTable:
    """Return the process-wide table, built on first use.

    Raises:
        ValueError: ``VERONICA_UNKNOWN_MODEL_PRICE`` is set but malformed.
    """
    global _default_table
    if _default_table is None:
        with _module_lock:
            if _default_table is None:
                raw = os.environ.get(UNKNOWN_MODEL_PRICE_ENV, "").strip()
                usd = None
                if raw:
                    try:
                        usd = check_usd(UNKNOWN_MODEL_PRICE_ENV, float(raw))
                    except ValueError as exc:
                        msg = f"{UNKNOWN_MODEL_PRICE_ENV} must be USD per 1M tokens, got {raw!r}"
                        raise ValueError(f"{msg} ({exc})") from None
                aliases = parse_model_aliases(os.environ.get(MODEL_ALIASES_ENV, ""))
                _default_table = PriceTable(aliases=aliases, unknown_model_price_usd_per_mtok=usd)
                remake_locks_after_fork(_default_table)
    return _default_table


# Bedrock: [region.]vendor.model[-vN][:N]; also the tail of an inference-profile ARN.
_BEDROCK_ID = re.compile(
    r"(?:(?:us|us-gov|eu|apac|global|jp|au|ca)\.)?"
    r"(?:anthropic|meta|amazon|cohere|mistral|ai21|deepseek|openai|qwen|writer)\."
    r"(?P<model>[a-z0-9][a-z0-9._-]*?)(?P<version>(?:-v\d+)?(?::\d+)?)"
)
# Vertex: model[-vN]@version, version a date, a number or "latest".
_VERTEX_ID = re.compile(r"(?P<model>[a-z0-9][a-z0-9._-]*?)(?:-v\d+)?@(?P<version>[a-z0-9]+)")


def canonical_model_name(model: str) -> str:
    """``model`` as its maker names it, lower-cased.

    Bedrock ids lose their cross-region prefix, vendor prefix and version
    suffix (``us.anthropic.claude-3-5-sonnet-20241022-v2:0`` ->
    ``claude-3-5-sonnet-20241022``; an ARN's last path part is the id); Vertex
    ids turn ``@date`` into ``-date`` and drop ``-vN`` (``claude-3-5-sonnet-v2@20241022``
    -> ``claude-3-5-sonnet-20241022``). Any other name is returned lower-cased.
    """
    name = model.strip().lower()
    if name.startswith("arn:") and "/" in name:
        name = name.rsplit("/", 1)[1]
    bedrock = _BEDROCK_ID.fullmatch(name)
    if bedrock is not None:
        base = bedrock["model"]
        # Keep a suffix that is the whole version (anthropic.claude-v2:1 is claude-v2).
        name = base if any(ch.isdigit() for ch in base) else base + bedrock["version"]
        name = name.split(":", 1)[0]
    vertex = _VERTEX_ID.fullmatch(name)
    if vertex is not None:
        version = vertex["version"]
        name = vertex["model"] if version == "latest" else f"{vertex['model']}-{version}"
    return name


def parse_model_aliases(raw: str, variable: str = MODEL_ALIASES_ENV) -> dict[str, str]:
    """Parse ``"name=model,other=model"`` into ``{name: model}`` (names lower-cased).

    Raises:
        ValueError: An entry is not ``name=model``, a name is mapped twice or
            to itself, or a target is itself an alias; ``variable`` is named.
    """
    aliases: dict[str, str] = {}
    for entry in raw.split(","):
        if not entry.strip():
            continue  # a trailing comma
        name, sep, target = (part.strip() for part in entry.partition("="))
        if not sep or not name or not target or "=" in target:
            shown = repr(entry.strip())
            shown = shown if len(shown) <= 80 else f"{shown[:77]}..."  # not a megabyte back
            raise ValueError(
                f"{variable}: {shown} is not name=model "
                f'(e.g. {variable}="my-gpt4o-deploy=gpt-4o,other=claude-sonnet-4-5")'
            )
        key = name.lower()
        if key in aliases:
            raise ValueError(f"{variable}: {name[:80]!r} is mapped twice")
        if key == target.lower():
            raise ValueError(f"{variable}: {name[:80]!r} is mapped to itself")
        aliases[key] = target
    for key, target in aliases.items():
        if target.lower() in aliases:
            raise ValueError(
                f"{variable}: {key[:80]!r} maps to {target[:80]!r}, itself an alias; "
                "name the model directly"
            )
    return aliases


def _bundled_snapshot() -> DataSnapshot:
    # Our own snapshot over the data bundled in the wheel: never the network
    # updater's, and with lookup caches nobody else mutates.
    global _snapshot
    with _module_lock:
        if _snapshot is None:
            from genai_prices.data import providers
            from genai_prices.data_snapshot import DataSnapshot

            _snapshot = DataSnapshot(providers=providers, from_auto_update=False)
        return _snapshot


def _from_genai_prices(
    provider: str | None, model: str, context: Mapping[str, str] | None
) -> UnitPrices | None:
    snapshot = _bundled_snapshot()
    if provider is not None:
        try:
            snapshot.find_provider(None, provider, None)
        except LookupError:
            provider = None  # a provider genai-prices does not know: match the model name
    try:
        found, info = snapshot.find_provider_model(model, None, provider, None)
    except LookupError:
        return None
    prices = _to_unit_prices(_candidates(found, info, context))
    if prices is None:
        return None
    window = info.context_window
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        window = None
    limit = max_output_tokens(canonical_model_name(model))
    return replace(prices, max_output=limit, context_window=window)


def max_output_tokens(model: str) -> int | None:
    """The largest output ``model`` accepts per call, from :data:`MAX_OUTPUT_TOKENS`.

    ``None`` for a model not in the table. A dated snapshot or ``-latest``
    alias of a listed model has its limit; the longest listed name wins.
    """
    name = model.strip().lower()
    best: str | None = None
    for base in MAX_OUTPUT_TOKENS:
        if name == base:
            return MAX_OUTPUT_TOKENS[base]
        if name.startswith(base + "-") and (best is None or len(base) > len(best)):
            rest = name[len(base) + 1 :]
            if rest == "latest" or rest[:1].isdigit():
                best = base
    return None if best is None else MAX_OUTPUT_TOKENS[best]


def _candidates(
    provider: Provider, info: ModelInfo, context: Mapping[str, str] | None
) -> list[ModelPrice]:
    from genai_prices.types import TimeOfDateConstraint

    if context and not any(info is m for m in provider.models):
        context = None  # as genai-prices: a fallback provider's model has no variants
    now = datetime.now(tz=UTC)
    times = [now]
    # Time-of-day prices (off-peak discounts) change while the cache lives: take
    # every period of today and keep the dearest, the conservative choice.
    for conditional in info.prices if isinstance(info.prices, list) else ():
        if isinstance(conditional.constraint, TimeOfDateConstraint):
            for moment in (conditional.constraint.start_time, conditional.constraint.end_time):
                times.append(datetime.combine(now.date(), moment))
    return [info.get_prices(t, context) for t in times]


def _price_at(model_price: ModelPrice, key: str, input_tokens: int) -> Decimal | None:
    from genai_prices.types import TieredPrices

    value: Any = getattr(model_price, key, None)
    if isinstance(value, TieredPrices):
        applicable = value.base
        for tier in value.tiers:  # ascending; a tier applies above its start
            if input_tokens > tier.start:
                applicable = tier.price
        return applicable
    return value if isinstance(value, Decimal) else None


def _components(model_price: ModelPrice, input_tokens: int) -> list[Decimal] | None:
    def at(key: str) -> Decimal | None:
        return _price_at(model_price, key, input_tokens)

    i, o = at("input_mtok"), at("output_mtok")
    if i is None and o is None:
        return None  # no token price (free tier, subscription, per-request): unknown
    # One side missing (embeddings): price it like the other, never free.
    i = o if i is None else i
    o = i if o is None else o
    assert i is not None and o is not None
    c, r = at("cache_read_mtok"), at("output_reasoning_mtok")
    if at("output_audio_mtok") is not None:
        # A model that speaks (realtime, gpt-audio, Live) bills audio and image
        # tokens at their own, dearer rates, and its input is a conversation or
        # audio the request does not show: its worst case is its dearest rate.
        i = max(p for p in (i, at("input_audio_mtok"), at("input_image_mtok")) if p is not None)
        o = max(o, at("output_audio_mtok") or o)
        c = max(
            (p for p in (c, at("cache_audio_read_mtok"), at("cache_image_read_mtok")) if p),
            default=None,
        )
    # One cache-write price for both TTLs: the dearer (1h) one, conservatively.
    writes = [w for w in (at("cache_write_mtok"), at("cache_write_1h_mtok")) if w is not None]
    return [i, o, i if c is None else c, o if r is None else r, max(writes, default=i)]


def _to_unit_prices(candidates: list[ModelPrice]) -> UnitPrices | None:
    from genai_prices.types import TieredPrices

    starts = sorted(
        {
            tier.start
            for price in candidates
            for value in vars(price).values()
            if isinstance(value, TieredPrices)
            for tier in value.tiers
        }
    )
    segments: list[UnitPrices] = []
    for n in [0, *(s + 1 for s in starts)]:
        rows = [_components(price, n) for price in candidates]
        if any(row is None for row in rows):
            return None
        dearest = [max(column) for column in zip(*(row for row in rows if row), strict=True)]
        a, b, c, d, e = (_nano(price) for price in dearest)
        segments.append(UnitPrices(a, b, c, d, e))
    return replace(segments[0], tiers=tuple(zip(starts, segments[1:], strict=True)))


def _nano(usd_per_mtok: Decimal) -> int:
    with localcontext() as ctx:
        ctx.prec = 60
        return int((usd_per_mtok * NANO_PER_USD).to_integral_value(rounding=ROUND_CEILING))


def estimate_input_tokens(text: str) -> int:
    """Return an upper bound on the input tokens of one message holding ``text``.

    See :data:`INPUT_TOKEN_BOUND`: UTF-8 bytes plus the framing of one message
    and of the request.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    n_bytes = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return n_bytes + TOKENS_PER_MESSAGE + TOKENS_PER_REQUEST


def estimate_input_tokens_from_bytes(n_bytes: int, n_messages: int = 1) -> int:
    """Return an upper bound on the input tokens of ``n_messages`` totalling ``n_bytes``.

    ``n_bytes`` counts the UTF-8 bytes of every text sent (contents, names,
    tool arguments); see :data:`INPUT_TOKEN_BOUND`.
    """
    n = check_count("n_bytes", n_bytes)
    m = check_count("n_messages", n_messages)
    return n + m * TOKENS_PER_MESSAGE + TOKENS_PER_REQUEST
