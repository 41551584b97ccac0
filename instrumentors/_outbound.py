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
``veronica.depth`` (the sender's hop depth) and ``veronica.grant`` (the
signed grant of what the chain has left), in the W3C ``baggage`` header --
written directly and set in the context, so it goes out whether or not an
OpenTelemetry HTTP instrumentation injects baggage, and matches what one
injects. The ``veronica-spent`` header of the answer, when signed with the
same key and bound to the grant's nonce, is committed into the chain.

The chain propagated is the active one (:func:`~veronica_otel.current_context`),
else the process default chain of zero-code instrumentation.
"""

from __future__ import annotations

import fnmatch
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from veronica_otel._context import ExecutionContext
from veronica_otel._grants import (
    DEFAULT_GRANT_TTL_S,
    SPENT_HEADER,
    coerce_key,
    grant_key_from_env,
    sign_grant,
    verify_spent,
)
from veronica_otel._propagation import default_context
from veronica_otel._remote import commit_spent, issue_grant

__all__ = [
    "DEFAULT_VENDOR_HOSTS",
    "PROPAGATE_HOSTS_ENV",
    "VENDOR_HOSTS_ENV",
    "HostPattern",
    "Plan",
    "Propagation",
    "rewrite_baggage",
]

_logger = logging.getLogger("veronica_otel.instrumentors")
BAGGAGE_PREFIX = "veronica."
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


@dataclass(slots=True)
class Plan:
    """What one outgoing request carries, and how to settle its answer."""

    entries: dict[str, str] = field(default_factory=dict)
    ctx: ExecutionContext | None = None
    nonce: str | None = None


_STRIP_ONLY = Plan()


class Propagation:
    """The propagation policy of one instrumentor (see the module docs).

    Args:
        propagate_hosts: Allow-list (else ``VERONICA_PROPAGATE_HOSTS``, else none).
        vendor_hosts: Extra vendor hosts, added to the built-in list (else
            ``VERONICA_VENDOR_HOSTS``).
        grant_key: HMAC key (else ``VERONICA_GRANT_KEY``).
        grant_ttl_s: How long a grant stays valid after it is sent.
        environ: Environment to read instead of ``os.environ``.
    """

    def __init__(
        self,
        *,
        propagate_hosts: str | Sequence[str] | None = None,
        vendor_hosts: str | Sequence[str] | None = None,
        grant_key: bytes | str | None = None,
        grant_ttl_s: float = DEFAULT_GRANT_TTL_S,
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
        extra = (
            parse_hosts(vendor_hosts, "vendor_hosts")
            if vendor_hosts is not None
            else parse_hosts(env.get(VENDOR_HOSTS_ENV, ""), VENDOR_HOSTS_ENV)
        )
        self.vendors = parse_hosts(DEFAULT_VENDOR_HOSTS, "DEFAULT_VENDOR_HOSTS") + extra
        self.key = (
            coerce_key(grant_key, "grant_key") if grant_key is not None else grant_key_from_env(env)
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
        grant = issue_grant(ctx, ttl_s=self.ttl_s)
        entries = {
            "veronica.chain": ctx.chain_id,
            "veronica.depth": str(ctx.depth),
            "veronica.grant": sign_grant(grant, self.key),
        }
        return Plan(entries, ctx, grant.nonce)

    def settle(self, plan: Plan, header: str | None) -> None:
        """Commit the answer's ``veronica-spent`` into the chain the grant came from."""
        if plan.nonce is None or plan.ctx is None or self.key is None or header is None:
            return
        used = verify_spent(header, self.key, plan.nonce)
        if used is None:
            _logger.warning(
                "veronica-otel: ignored a %s header that is unsigned or not bound to "
                "the grant sent (chain %s)",
                SPENT_HEADER,
                plan.ctx.chain_id,
            )
            return
        commit_spent(plan.ctx, used)


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


def log_failure(what: str) -> None:
    """Our failure never breaks the host program: log it and carry on."""
    _logger.exception("veronica-otel: %s failed; the request is sent without chain baggage", what)
