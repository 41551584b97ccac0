"""Zero-code containment: the ``veronica`` OpenTelemetry distro and configurator.

``opentelemetry-instrument python app.py`` loads, in order, a distro, a
configurator and the instrumentors. If the configurator fails (for example
the OTLP exporter it defaults to is not installed), the instrumentors are
never loaded and only a log line says so. Enforcement must not depend on that
path, so :class:`VeronicaDistro` installs the enforcement wrappers itself,
first: as post-import hooks on the client libraries, so nothing is imported
that the app does not import.

The process default chain comes from the ``VERONICA_*`` variables, and from
the policy file named by ``VERONICA_POLICY_FILE`` when it is set. A
malformed value or file is not silently ignored: it is logged loudly and
every contained call then raises a ``ValueError`` naming the variable or the
file (fail closed). Every ``VERONICA_*`` variable is checked at start-up,
including those other parts read later (``VERONICA_GRANT_KEY``,
``VERONICA_PROPAGATE_HOSTS``, ``VERONICA_VENDOR_HOSTS``,
``VERONICA_FAIL_OPEN``, ``VERONICA_UNKNOWN_MODEL_PRICE``), and any other
failure while loading (a hostile policy file, say) fails closed the same way.

The default chain is per process. A child made with ``os.fork`` (or
multiprocessing's fork start method) builds its own, with the same limits
and a new chain id: N forked workers have N budgets. With
``VERONICA_REDIS_URL`` the default chain lives in the shared store, and a
forked child keeps counting the same chain there: one budget for all.

Whatever else is installed, enforcement goes in through every door that
runs, once (:func:`ensure_installed`): this distro when it is the one
selected; the ``opentelemetry_pre_instrument`` hook and each of our
``opentelemetry_instrumentor`` entry points when another distro
(``opentelemetry-distro``) wins, in any entry-point order; and, when a
configurator or exporter fails and ``opentelemetry-instrument`` loads no
instrumentor at all, the ``veronica_otel_zero_code.pth`` start-up file, which
runs it after OpenTelemetry's own initialisation, whatever that raised
(:mod:`veronica_otel.startup._autostart`). Selecting a distro is never needed.

``VERONICA_POOLS=tenant:acme,user:alice`` joins the default chain to those
budget pools, their limits read from the policy file's ``[pools]`` (and
re-read when it reloads); with ``VERONICA_REDIS_URL`` they live in the
shared store. A name the file does not define is a start-up error.

``VERONICA_THREADS=false`` leaves ``threading`` alone: work started in
threads then runs outside the chain (the process default chain still
applies there).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from importlib.metadata import EntryPoint
from typing import Any

import wrapt
from opentelemetry.instrumentation.distro import BaseDistro  # type: ignore[attr-defined]
from opentelemetry.sdk._configuration import _OTelSDKConfigurator

from veronica_otel._config import ExecutionConfig, parse_env_bool
from veronica_otel._context import ExecutionContext
from veronica_otel._context import _valid_id as valid_chain_id
from veronica_otel._file_pools import pools_from_env
from veronica_otel._ledger import Ledger
from veronica_otel._notice import PRINTED
from veronica_otel._propagation import set_default_context, set_default_context_error

from .policy_file import PolicyFile, install_default_chain

__all__ = [
    "VeronicaConfigurator",
    "VeronicaDistro",
    "ZeroCodeEntry",
    "ensure_installed",
    "install_zero_code",
    "pre_instrument",
]

_logger = logging.getLogger(__name__)

# (module whose import triggers the hook, instrumentor module, class name)
_INSTRUMENTORS = (
    ("openai._base_client", "veronica_otel.instrumentors.openai", "OpenAIInstrumentor"),
    ("anthropic._base_client", "veronica_otel.instrumentors.anthropic", "AnthropicInstrumentor"),
    ("groq._base_client", "veronica_otel.instrumentors.groq", "GroqInstrumentor"),
    ("mcp.client.session", "veronica_otel.instrumentors.mcp", "MCPInstrumentor"),
    ("langchain_core.tools.base", "veronica_otel.instrumentors.langchain", "LangChainInstrumentor"),
    ("ag2.agent", "veronica_otel.instrumentors.ag2", "AG2Instrumentor"),
    (
        "agents.run_internal.run_loop",
        "veronica_otel.instrumentors.openai_agents",
        "OpenAIAgentsInstrumentor",
    ),
    ("crewai.agent.core", "veronica_otel.instrumentors.crewai", "CrewAIInstrumentor"),
    (
        "pydantic_ai._agent_graph",
        "veronica_otel.instrumentors.pydantic_ai",
        "PydanticAIInstrumentor",
    ),
    ("dspy.clients.execution", "veronica_otel.instrumentors.dspy", "DSPyInstrumentor"),
    ("strands.agent.agent", "veronica_otel.instrumentors.strands", "StrandsInstrumentor"),
    ("smolagents.agents", "veronica_otel.instrumentors.smolagents", "SmolagentsInstrumentor"),
    (
        "llama_index.core.agent.workflow",
        "veronica_otel.instrumentors.llama_index",
        "LlamaIndexInstrumentor",
    ),
    ("google.adk.runners", "veronica_otel.instrumentors.google_adk", "GoogleADKInstrumentor"),
    ("langgraph.pregel._runner", "veronica_otel.instrumentors.langgraph", "LangGraphInstrumentor"),
    ("mistralai.client.basesdk", "veronica_otel.instrumentors.mistralai", "MistralAIInstrumentor"),
    ("cohere.core.http_client", "veronica_otel.instrumentors.cohere", "CohereInstrumentor"),
    ("botocore.client", "veronica_otel.instrumentors.bedrock", "BedrockInstrumentor"),
    ("ollama._client", "veronica_otel.instrumentors.ollama", "OllamaInstrumentor"),
    ("litellm", "veronica_otel.instrumentors.litellm", "LiteLLMInstrumentor"),
    (
        "google.genai._api_client",
        "veronica_otel.instrumentors.google_genai",
        "GoogleGenAIInstrumentor",
    ),
    # Chain propagation to your own services (VERONICA_PROPAGATE_HOSTS), and
    # the vendor rule: no baggage at all on requests to LLM vendors.
    ("httpx2", "veronica_otel.instrumentors.httpx", "HTTPXInstrumentor"),
    ("httpx", "veronica_otel.instrumentors.httpx", "HTTPXInstrumentor"),
    ("requests", "veronica_otel.instrumentors.requests", "RequestsInstrumentor"),
    ("urllib3", "veronica_otel.instrumentors.urllib3", "URLLib3Instrumentor"),
    ("aiohttp", "veronica_otel.instrumentors.aiohttp", "AioHTTPInstrumentor"),
)
_OUR_ENTRY_POINTS = frozenset(
    {
        "veronica_openai",
        "veronica_anthropic",
        "veronica_mcp",
        "veronica_langchain",
        "veronica_ag2",
        "veronica_openai_agents",
        "veronica_crewai",
        "veronica_pydantic_ai",
        "veronica_dspy",
        "veronica_strands",
        "veronica_smolagents",
        "veronica_llama_index",
        "veronica_google_adk",
        "veronica_langgraph",
        "veronica_httpx",
        "veronica_requests",
        "veronica_threading",
        "veronica_mistralai",
        "veronica_cohere",
        "veronica_bedrock",
        "veronica_ollama",
        "veronica_litellm",
        "veronica_google_genai",
        "veronica_groq",
        "veronica_urllib3",
        "veronica_aiohttp",
    }
)
_installed = False  # the enforcement hooks (tests set it to skip them)
_ensured = False  # a door ran install_zero_code: the others do nothing


def _instrument(instrumentor_module: str, class_name: str) -> Any:
    def hook(_module: object) -> None:
        instrumentor = None
        try:
            module = __import__(instrumentor_module, fromlist=[class_name])
            instrumentor = getattr(module, class_name)()
            if not instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.instrument(skip_dep_check=True)
        except Exception as exc:
            _fail_closed(instrumentor, class_name, exc)

    return hook


def _fail_closed(instrumentor: object, class_name: str, error: Exception) -> None:
    """An instrumentor failed under zero code: refuse its library's calls, and say so.

    Our SDK instrumentors refuse by themselves when the SDK does not fit
    (``InstrumentationError``); any other failure installs the same refusal
    here: calls through that library in a chain that limits anything raise,
    unless ``VERONICA_FAIL_OPEN=true``. Never uncontained silently.
    """
    from veronica_otel.instrumentors._hooks import InstrumentationError, SDKHooks

    _logger.error(  # printed below, in one line
        "veronica-otel could not install %s", class_name, exc_info=error, extra={PRINTED: True}
    )
    hooks = getattr(instrumentor, "_hooks", None)
    if not isinstance(hooks, SDKHooks):
        print(
            f"veronica-otel: ERROR: could not install {class_name} ({error!r}); "
            "calls through it are NOT contained",
            file=sys.stderr,
        )
        return
    if not isinstance(error, InstrumentationError):
        error = InstrumentationError(
            f"veronica-otel could not install {class_name} ({error!r}): {hooks.library} "
            "calls made in a chain are refused (VERONICA_FAIL_OPEN=true lets them through "
            "uncontained)"
        )
        hooks.refuse(error)
    print(f"veronica-otel: ERROR: {error}", file=sys.stderr)


def install_zero_code(environ: dict[str, str] | None = None) -> ExecutionContext | None:
    """Install enforcement wrappers and the default chain from ``VERONICA_*``.

    With ``VERONICA_POLICY_FILE`` set, the chain follows that file
    (:func:`~veronica_otel.policy_file.install_default_chain`). Idempotent.
    Returns the default chain, or None when the configuration is malformed
    (calls then fail closed with an error naming the variable or the file).
    """
    global _installed
    env = os.environ if environ is None else environ
    if not _installed:
        for trigger, module, name in _INSTRUMENTORS:
            wrapt.register_post_import_hook(_instrument(module, name), trigger)
        if _threads_wanted(env):  # the chain follows into threads and pools
            _instrument("veronica_otel.instrumentors.threading", "ThreadingInstrumentor")(None)
        _installed = True
    try:
        _check_environment(env)
        ledger, chain_id = _shared_store(env)
        policy = PolicyFile.from_env(environ)
        pools = pools_from_env(env, policy, ledger)  # VERONICA_POOLS
        if policy is not None:  # VERONICA_POLICY_FILE: the chain follows the file
            ctx = install_default_chain(
                policy, environ, ledger=ledger, chain_id=chain_id, pools=pools
            )
            _logger.info("veronica-otel: default chain %s from %s", ctx.chain_id, policy.path)
            return ctx
        config = ExecutionConfig.from_env(environ)
    except Exception as exc:  # whatever went wrong, never run uncontained silently
        error = exc if isinstance(exc, ValueError) else _configuration_error(exc)
        set_default_context_error(error)
        _logger.error(
            "veronica-otel: %s; every LLM call will be refused until it is fixed",
            error,
            extra={PRINTED: True},  # printed next
        )
        print(f"veronica-otel: ERROR: {error}; LLM calls will be refused", file=sys.stderr)
        return None
    ctx = ExecutionContext(config, name="default", ledger=ledger, chain_id=chain_id, detached=True)
    set_default_context(ctx)
    _logger.info("veronica-otel: default chain %s with %s", ctx.chain_id, config)
    return ctx


def ensure_installed() -> None:
    """The door every zero-code path calls: :func:`install_zero_code` once, never raising.

    Whichever runs first (our distro, the pre-instrument hook, one of our
    instrumentor entry points, the start-up file) installs; the others find
    it done. A failure here is reported and makes LLM calls fail closed.
    """
    global _ensured
    if _ensured:
        return
    _ensured = True
    try:
        install_zero_code()
    except Exception as exc:  # registering the hooks failed: say so, refuse calls
        error = _configuration_error(exc)
        set_default_context_error(error)
        print(f"veronica-otel: ERROR: {error}; LLM calls will be refused", file=sys.stderr)


def pre_instrument() -> None:
    """The ``opentelemetry_pre_instrument`` hook: runs under any distro."""
    ensure_installed()


class ZeroCodeEntry:
    """What each of our ``opentelemetry_instrumentor`` entry points loads.

    Under another distro, ``opentelemetry-instrument`` calls
    ``load()().instrument()`` on every entry point: here that installs zero
    code (once), whose import hooks then instrument each library the app
    imports, exactly as under our own distro. Programmatic use takes the
    instrumentor classes (``veronica_otel.instrumentors.*``), not these.
    """

    @property
    def is_instrumented_by_opentelemetry(self) -> bool:
        return _ensured

    def instrument(self, **kwargs: Any) -> None:
        ensure_installed()

    def uninstrument(self, **kwargs: Any) -> None:
        """Zero code stays for the life of the process: uninstrument each class instead."""
        _logger.debug("veronica-otel: zero-code entry points cannot be uninstrumented")


def _threads_wanted(environ: Mapping[str, str]) -> bool:
    """``VERONICA_THREADS`` (default true); a malformed value is reported by the checks."""
    try:
        return not environ.get("VERONICA_THREADS", "").strip() or parse_env_bool(
            "VERONICA_THREADS", environ
        )
    except ValueError:
        return True  # fail closed: the chain still follows into threads


def _check_environment(environ: Mapping[str, str]) -> None:
    """Validate every ``VERONICA_*`` variable read later, lazily, by some other part.

    The grant key and the host lists are read when the HTTP instrumentors
    install, the unknown-model price and model aliases at the first priced call, fail-open when
    the store first fails: a bad value found then would turn a feature off
    (propagation) or fail far from its cause. Here it is a start-up error
    naming the variable.

    Raises:
        ValueError: The first malformed variable, named in the message.
    """
    from veronica_otel._grants import grant_key_from_env
    from veronica_otel._pricing import MODEL_ALIASES_ENV, parse_model_aliases
    from veronica_otel.instrumentors._outbound import (
        PROPAGATE_HOSTS_ENV,
        VENDOR_HOSTS_ENV,
        parse_hosts,
    )
    from veronica_otel.instrumentors._vendor_guard import guard_mode
    from veronica_otel.startup.policy_file import _env_unknown_price

    parse_env_bool("VERONICA_FAIL_OPEN", environ)
    parse_env_bool("VERONICA_THREADS", environ)
    grant_key_from_env(environ)
    for var in (PROPAGATE_HOSTS_ENV, VENDOR_HOSTS_ENV):
        parse_hosts(environ.get(var, ""), var)
    guard_mode(None, environ)
    _env_unknown_price(environ)
    parse_model_aliases(environ.get(MODEL_ALIASES_ENV, ""))


def _configuration_error(exc: Exception) -> ValueError:
    """A failure that is not a bad value (a bug, a recursion): still a clear error."""
    return ValueError(
        f"the VERONICA_* configuration could not be loaded ({type(exc).__name__}: {exc})"
    )


def _shared_store(environ: Mapping[str, str]) -> tuple[Ledger | None, str | None]:
    """The shared ledger and endpoint breakers from ``VERONICA_REDIS_URL``.

    ``VERONICA_CHAIN_ID`` names the default chain, so processes that share
    the store and the id share one budget; without it each process has a
    chain of its own (the endpoint breakers are shared either way).
    ``VERONICA_REDIS_PREFIX`` namespaces the keys (default ``veronica:``).
    """
    chain_id = environ.get("VERONICA_CHAIN_ID", "").strip() or None
    if chain_id is not None and not valid_chain_id(chain_id):
        raise ValueError(
            f"VERONICA_CHAIN_ID={chain_id!r} must be 1-128 characters of letters, digits and -_.:"
        )
    url = environ.get("VERONICA_REDIS_URL", "").strip()
    if not url:
        return None, chain_id
    prefix = environ.get("VERONICA_REDIS_PREFIX", "").strip() or "veronica:"
    try:
        from veronica_otel.distributed import RedisCircuitBreaker, RedisLedger
        from veronica_otel.distributed._connect import with_cluster_flag
        from veronica_otel.instrumentors._breakers import configure_endpoint_breakers
    except ImportError as exc:
        raise ValueError(
            f"VERONICA_REDIS_URL is set but the redis extra is not installed ({exc})"
        ) from None
    url = with_cluster_flag(url, environ)  # VERONICA_REDIS_CLUSTER, named if malformed
    try:
        ledger = RedisLedger.from_url(url, key_prefix=prefix)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"VERONICA_REDIS_URL: {exc}") from None

    def breaker(provider: str, model: str) -> Any:
        return RedisCircuitBreaker.from_url(url, f"{provider}/{model}", key_prefix=prefix)

    configure_endpoint_breakers(breaker)
    return ledger, chain_id


class VeronicaDistro(BaseDistro):  # type: ignore[misc]
    """Installs enforcement before the configurator runs, then the usual hooks."""

    def _configure(self, **kwargs: Any) -> None:
        ensure_installed()

    def load_instrumentor(self, entry_point: EntryPoint, **kwargs: Any) -> None:
        # Ours are already installed by post-import hooks; instrumenting again
        # would only log a warning. A broken foreign instrumentor must not
        # stop the others, so it is contained here too.
        if entry_point.name in _OUR_ENTRY_POINTS:
            return
        try:
            if getattr(entry_point.load()(), "is_instrumented_by_opentelemetry", False):
                return  # already on (a peer instrumentor the app turned on itself)
            super().load_instrumentor(entry_point, **kwargs)
        except Exception:
            _logger.exception("instrumentor %s failed to load", entry_point.name)


class VeronicaConfigurator(_OTelSDKConfigurator):
    """The SDK configurator (providers and exporters from ``OTEL_*``)."""
