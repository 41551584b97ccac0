"""Where a chain's baggage may go, and what comes back: shared by the HTTP clients.

Policy for each outgoing request (every hop, redirects included):

1. A request to an LLM vendor carries no baggage at all (``veronica.*`` or
   any other entry an OpenTelemetry HTTP instrumentation would inject). A vendor
   is a host on the built-in list (:data:`DEFAULT_VENDOR_HOSTS`, extended by
   ``vendor_hosts`` / ``VERONICA_VENDOR_HOSTS``), or any request sent by a
   vendor SDK (it carries ``x-stainless-lang``, as the ``openai`` and
   ``anthropic`` SDKs do, ``anthropic-version`` or ``x-goog-api-client``),
   whatever its host -- a local gateway or fake server included.
2. Otherwise the chain's entries go only to hosts on the allow-list
   (``propagate_hosts`` / ``VERONICA_PROPAGATE_HOSTS``: comma-separated
   ``host[:port]`` patterns, ``*`` matches any characters). The default is
   an empty list: nothing is propagated until you name your own services.
   Propagation also needs the grant key (``grant_key`` /
   ``VERONICA_GRANT_KEY``): an unsigned grant would be ignored anyway.
3. Every other request has any ``veronica.*`` baggage removed, including
   entries an inbound request brought into the context.

For an allowed host the request carries ``veronica.chain`` (the chain id),
``veronica.depth`` (the sender's hop depth) and ``veronica.grant`` (a signed
grant addressed to that ``host[:port]``), in the W3C ``baggage`` header --
written directly and set in the context, so it goes out whether or not an
OpenTelemetry HTTP instrumentation injects baggage, and matches what one
injects.

The grant's budget is carved out of the chain before the request leaves (a
ledger reservation: ``grant_max_cost_usd``, ``grant_max_steps`` and
``grant_max_tokens`` cap one grant, else it carries all that is left); a
grant that cannot be carved raises ``BudgetExceededError`` and the request is
not sent. The answer's ``veronica-spent`` header, signed by the service and
bound to the grant's nonce and audience, settles the carve, capped at it. No
header, an untrusted one, or a request that failed after it may have been
sent commits the whole carve. With a shared Redis ledger nothing is carved:
the service charges the chain directly.

The chain propagated is the active one (:func:`~veronica_otel.current_context`),
else the process default chain of zero-code instrumentation.
"""

from __future__ import annotations

import fnmatch
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from veronica_otel._attributes import BAGGAGE_CHAIN, BAGGAGE_DEPTH, BAGGAGE_GRANT, BAGGAGE_PREFIX
from veronica_otel._context import ExecutionContext
from veronica_otel._errors import BudgetExceededError
from veronica_otel._grants import (
    DEFAULT_GRANT_TTL_S,
    Spent,
    audience_of,
    coerce_keys,
    grant_key_from_env,
    record_spent_rejection,
    sign_grant,
    verify_spent,
)
from veronica_otel._propagation import default_context
from veronica_otel._remote import Carve, GrantLimits, issue_grant, settle
from veronica_otel._units import check_count, check_usd, usd_to_nano

__all__ = [
    "DEFAULT_VENDOR_HOSTS",
    "PROPAGATE_HOSTS_ENV",
    "VENDOR_HOSTS_ENV",
    "HostPattern",
    "Plan",
    "Propagation",
    "rewrite_baggage",
    "vendor_patterns",
]

_logger = logging.getLogger("veronica_otel.instrumentors")
PROPAGATE_HOSTS_ENV = "VERONICA_PROPAGATE_HOSTS"
VENDOR_HOSTS_ENV = "VERONICA_VENDOR_HOSTS"
DEFAULT_VENDOR_HOSTS: tuple[str, ...] = (
    "api.openai.com",
    "*.openai.com",
    "*.openai.azure.com",
    "*.cognitiveservices.azure.com",
    "*.services.ai.azure.com",
    "*.models.ai.azure.com",
    "api.anthropic.com",
    "*.anthropic.com",
    "generativelanguage.googleapis.com",
    "aiplatform.googleapis.com",
    "*-aiplatform.googleapis.com",
    "bedrock-runtime.*.amazonaws.com",
    "bedrock-runtime-fips.*.amazonaws.com",
    "bedrock.*.amazonaws.com",
    "bedrock-agent-runtime.*.amazonaws.com",
    "api.mistral.ai",
    "api.cohere.com",
    "api.cohere.ai",
    "api.groq.com",
    "api.together.xyz",
    "api.together.ai",
    "api.fireworks.ai",
    "api.deepseek.com",
    "api.x.ai",
    "openrouter.ai",
    "api.perplexity.ai",
    "api-inference.huggingface.co",
    "router.huggingface.co",
)
# A request carrying one of these headers was sent by an LLM vendor's SDK.
_SDK_HEADERS = ("x-stainless-lang", "anthropic-version", "x-goog-api-client")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
# httpx / httpx2 errors raised before any byte of the request left.
_NOT_SENT = frozenset({"ConnectError", "ConnectTimeout"})


@dataclass(frozen=True, slots=True)
class HostPattern:
    """``host[:port]`` with ``*`` wildcards in the host; no port matches any port."""

    host: str
    port: int | None = None

    @classmethod
    def parse(cls, text: str, name: str) -> HostPattern:
        """Parse one pattern; ``ValueError`` naming ``name`` when it is not one."""
        raw = text.strip().lower()
        host, port = raw, None
        if raw.startswith("["):  # [v6] or [v6]:port
            end = raw.find("]")
            host, rest = raw[1:end], raw[end + 1 :]
            if end < 0 or (rest and not rest.startswith(":")):
                raise ValueError(f"{name}: bad host pattern {_shown(text)}")
            port = _port(rest[1:], text, name) if rest else None
        elif raw.count(":") == 1:
            host, _, digits = raw.partition(":")
            port = _port(digits, text, name)
        if not host or any(c in host for c in " /?#@,"):
            raise ValueError(f"{name}: bad host pattern {_shown(text)}")
        return cls(host, port)

    def matches(self, host: str, port: int | None) -> bool:
        if self.port is not None and port != self.port:
            return False
        return fnmatch.fnmatchcase(host, self.host)


def _port(digits: str, text: str, name: str) -> int:
    # ASCII digits, at most 5 of them: int() would read other scripts' digits
    # and refuse thousands of them, with a message that names nothing.
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 5) or not (
        0 < int(digits) < 65536
    ):
        raise ValueError(f"{name}: bad port in host pattern {_shown(text)}")
    return int(digits)


def _shown(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 80 else f"{shown[:77]}..."


def parse_hosts(value: str | Sequence[str], name: str) -> tuple[HostPattern, ...]:
    """Patterns from a comma-separated string or a sequence of strings."""
    items = value.split(",") if isinstance(value, str) else list(value)
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"{name} must hold strings, got {item!r}")
    return tuple(HostPattern.parse(item, name) for item in items if item.strip())


def vendor_patterns(
    vendor_hosts: str | Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[HostPattern, ...]:
    """The LLM vendors' hosts: the built-in list plus ``vendor_hosts``, else
    ``VERONICA_VENDOR_HOSTS`` (the baggage rule and the vendor guard share it)."""
    if vendor_hosts is not None:
        extra = parse_hosts(vendor_hosts, "vendor_hosts")
    else:
        env = os.environ if environ is None else environ
        extra = parse_hosts(env.get(VENDOR_HOSTS_ENV, ""), VENDOR_HOSTS_ENV)
    return parse_hosts(DEFAULT_VENDOR_HOSTS, "DEFAULT_VENDOR_HOSTS") + extra


@dataclass(slots=True)
class Plan:
    """What one outgoing request carries, and how to settle its answer."""

    entries: dict[str, str] = field(default_factory=dict)
    ctx: ExecutionContext | None = None
    nonce: str | None = None
    audience: str = ""
    carve: Carve | None = None


_STRIP_ONLY = Plan()


class Propagation:
    """The propagation policy of one instrumentor (see the module docs).

    Args:
        propagate_hosts: Allow-list (else ``VERONICA_PROPAGATE_HOSTS``, else none).
        vendor_hosts: Extra vendor hosts, added to the built-in list (else
            ``VERONICA_VENDOR_HOSTS``).
        grant_key: HMAC key, or ``{kid: key}`` (first signs) (else
            ``VERONICA_GRANT_KEYS`` / ``VERONICA_GRANT_KEY``).
        grant_ttl_s: How long a grant stays valid after it is sent.
        grant_max_cost_usd: Most one grant carves, USD (else
            ``VERONICA_GRANT_MAX_COST_USD``, else all that is left).
        grant_max_steps: Most steps one grant carves (else
            ``VERONICA_GRANT_MAX_STEPS``, else all left; at most 32).
        grant_max_tokens: Most tokens one grant carves (else
            ``VERONICA_GRANT_MAX_TOKENS``, else all that is left).
        environ: Environment to read instead of ``os.environ``.
    """

    def __init__(
        self,
        *,
        propagate_hosts: str | Sequence[str] | None = None,
        vendor_hosts: str | Sequence[str] | None = None,
        grant_key: bytes | str | None = None,
        grant_ttl_s: float = DEFAULT_GRANT_TTL_S,
        grant_max_cost_usd: float | None = None,
        grant_max_steps: int | None = None,
        grant_max_tokens: int | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        if isinstance(grant_ttl_s, bool) or not isinstance(grant_ttl_s, (int, float)):
            raise TypeError(f"grant_ttl_s must be a number of seconds, got {grant_ttl_s!r}")
        if not 0 < grant_ttl_s <= 3600:
            raise ValueError(f"grant_ttl_s must be in (0, 3600], got {grant_ttl_s!r}")
        if propagate_hosts is not None:
            self.allow = parse_hosts(propagate_hosts, "propagate_hosts")
        else:
            self.allow = parse_hosts(env.get(PROPAGATE_HOSTS_ENV, ""), PROPAGATE_HOSTS_ENV)
        self.vendors = vendor_patterns(vendor_hosts, env)
        self.key = (
            coerce_keys(grant_key, "grant_key")
            if grant_key is not None
            else grant_key_from_env(env)
        )
        cost = _setting(grant_max_cost_usd, "grant_max_cost_usd", env, float, check_usd)
        steps = _setting(grant_max_steps, "grant_max_steps", env, int, check_count)
        tokens = _setting(grant_max_tokens, "grant_max_tokens", env, int, check_count)
        self.limits = GrantLimits(
            cost_nano=None if cost is None else usd_to_nano(cost), steps=steps, tokens=tokens
        )
        self.ttl_s = float(grant_ttl_s)
        self.active = True
        if self.allow and self.key is None:
            _logger.warning(
                "veronica-otel: propagate hosts are set but VERONICA_GRANT_KEY is not; "
                "no chain is propagated (an unsigned grant would be ignored)"
            )

    def is_vendor(self, host: str, port: int | None, has_header: Callable[[str], bool]) -> bool:
        """Whether a request goes to (or is sent by the SDK of) an LLM vendor."""
        if any(has_header(name) for name in _SDK_HEADERS):  # the cheap test first
            return True
        return any(pattern.matches(host, port) for pattern in self.vendors)

    def to_vendor(
        self, scheme: str, host: str | None, port: int | None, has_header: Callable[[str], bool]
    ) -> bool:
        """:meth:`is_vendor` for a raw URL: such a request carries no baggage at all.

        Not only ours: an OpenTelemetry HTTP instrumentation would forward
        every baggage entry of the context (user ids, tenant names) to the
        vendor. The HTTP instrumentors remove the header and clear the context.
        """
        if any(has_header(name) for name in _SDK_HEADERS):
            return True
        if not host:
            return False
        if port is None:
            port = _DEFAULT_PORTS.get(scheme.lower())
        host = host.lower().rstrip(".")
        return any(pattern.matches(host, port) for pattern in self.vendors)

    def plan(
        self, scheme: str, host: str | None, port: int | None, has_header: Callable[[str], bool]
    ) -> Plan:
        """Decide what one request carries (empty entries: strip ours)."""
        if not self.active or self.key is None or not host:
            return _STRIP_ONLY
        host = host.lower().rstrip(".")
        if port is None:
            port = _DEFAULT_PORTS.get(scheme.lower())
        if not any(pattern.matches(host, port) for pattern in self.allow):
            return _STRIP_ONLY
        if self.is_vendor(host, port, has_header) or not is_instrumentation_enabled():
            return _STRIP_ONLY
        try:
            ctx = default_context()
        except Exception:  # the process default chain is misconfigured
            return _STRIP_ONLY
        if ctx is None:
            return _STRIP_ONLY
        audience = audience_of(host, port, scheme)
        # Raises BudgetExceededError (the request is not sent) when nothing can be carved.
        grant, carve = issue_grant(ctx, audience=audience, ttl_s=self.ttl_s, limits=self.limits)
        try:
            entries = {
                BAGGAGE_CHAIN: ctx.chain_id,
                BAGGAGE_DEPTH: str(ctx.depth),
                BAGGAGE_GRANT: sign_grant(grant, self.key),
            }
        except BaseException:
            if carve is not None:
                settle(carve, Spent())  # never sent: give the carve back
            raise
        return Plan(entries, ctx, grant.nonce, audience, carve)

    def settle(self, plan: Plan, header: str | None) -> None:
        """Settle the carve with the answer's ``veronica-spent`` (all of it when untrusted)."""
        carve = plan.carve
        if carve is None or plan.nonce is None or self.key is None:
            return
        used = verify_spent(header, self.key, plan.nonce, plan.audience)
        if isinstance(used, str):
            record_spent_rejection(used, carve.ctx.chain_id)
            settle(carve, None)
            return
        settle(carve, used)

    def unsent(self, plan: Plan) -> None:
        """The request will not be sent: give its carve back."""
        if plan.carve is not None:
            try:
                settle(plan.carve, Spent())
            except Exception:
                _logger.exception("veronica-otel: releasing an unsent grant failed")

    def failed(self, plan: Plan, exc: BaseException) -> None:
        """The request raised: release the carve if it surely never left, else commit it all."""
        if plan.carve is None:
            return
        try:
            never_sent = type(exc).__name__ in _NOT_SENT
            settle(plan.carve, Spent() if never_sent else None)
        except Exception:
            _logger.exception("veronica-otel: settling a grant after a failed request failed")


def _setting(
    given: Any,
    name: str,
    env: Mapping[str, str],
    parse: Callable[[str], Any],
    check: Callable[[str, object], Any],
) -> Any:
    """A per-grant cap: the argument, else ``VERONICA_<NAME>``, else None (validated)."""
    if given is not None:
        return check(name, given)
    var = f"VERONICA_{name.upper()}"
    raw = env.get(var, "").strip()
    if not raw:
        return None
    try:
        return check(var, parse(raw))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{var}: {exc}" if var in str(exc) else f"{var}: bad value") from None


def context_for(entries: Mapping[str, str]) -> otel_context.Context:
    """The current context with ``veronica.*`` baggage replaced by ``entries``."""
    ctx = otel_context.get_current()
    for key in baggage.get_all(ctx):
        if key.startswith(BAGGAGE_PREFIX):
            ctx = baggage.remove_baggage(key, ctx)
    for key, value in entries.items():
        ctx = baggage.set_baggage(key, value, ctx)
    return ctx


def rewrite_baggage(values: Sequence[str], entries: Mapping[str, str]) -> str | None:
    """The ``baggage`` header with ``veronica.*`` members replaced by ``entries``.

    ``values`` are the request's ``baggage`` header values (repeated headers
    are one list). Returns None when nothing is left to send.
    """
    members = [
        member.strip()
        for value in values
        for member in value.split(",")
        if member.strip()
        and not unquote(member.split("=", 1)[0].strip()).startswith(BAGGAGE_PREFIX)
    ]
    members.extend(f"{quote(key)}={quote(value, safe='')}" for key, value in entries.items())
    return ",".join(members) or None


def prepare_failed(exc: Exception, what: str) -> None:
    """A denial (nothing could be carved) stops the request; any other failure is logged."""
    if isinstance(exc, BudgetExceededError):
        raise exc
    log_failure(what)


def log_failure(what: str) -> None:
    """Our failure never breaks the host program: log it and carry on."""
    _logger.exception("veronica-otel: %s failed; the request is sent without chain baggage", what)
