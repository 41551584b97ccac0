"""Every POST endpoint of the Stainless SDKs (``openai``, ``groq``, ``anthropic``):
billed per token (read by the SDK's own request reader), per unit, bounded
per request, or free; and the adapter that contains the ones billed otherwise
than per token.

The token endpoints (chat, responses, completions, embeddings, messages) are
read by ``_openai_request`` / ``_anthropic_request``; a request they do not
route comes here (:func:`endpoint_call`) and is looked up in the SDK's table
by its path template (matched at the end of the URL: Azure and Groq prefix
their paths):

- per unit (:data:`IMAGE`, :data:`CHARACTER`, :data:`SECOND`): a call, its
  units (images times ``n``, characters of ``input``, video ``seconds``)
  reserved at the unit price of its model and variant (size, quality) from
  the policy file's ``[prices]`` (``per_image`` / ``per_character`` /
  ``per_second``) or the providers' list prices (:mod:`veronica_otel._unit_prices`),
  and committed whole (the request fixes the units);
- bounded (:data:`REQUEST`): work the provider bills after the call returns
  or in units the request does not show (batches, tuning jobs, assistant
  runs, audio seconds of an upload): the configured bound
  (``[prices."openai:batches"] per_request = 25.0``) is reserved and
  committed; a batch whose requests are known is priced from them at the
  batch rate (half the standard price) instead: an Anthropic message batch
  (its requests are in its body), an OpenAI batch whose input file this
  process uploaded (:mod:`._batch_file`);
- free: not routed at all (``models.list``, ``files.create``, retrieve, list,
  cancel, delete, ``count_tokens``).

An endpoint with no price (no unit price for its model, no bound) is refused
under a cost ceiling before it is sent, the error naming the ``[prices]``
entry that would price it; without a cost ceiling it is admitted all the
same: a step, and every other limit. A POST in no table (an endpoint newer
than this list) is such an unpriced call. ``tests/unit/test_endpoint_table.py``
walks the installed SDKs' resources so that a new endpoint fails a test.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from opentelemetry import context as otel_context

from veronica_otel._attributes import UNPRICED
from veronica_otel._context import ExecutionContext
from veronica_otel._pricing import PriceTable
from veronica_otel._propagation import default_context
from veronica_otel._unit_prices import request_bound_cents

from ._adapter import ProviderAdapter, Request, wrapper
from ._admit import input_bound
from ._batch_file import BATCH_DISCOUNT, batch_cents, read_upload, remember
from ._bounds import how_to_bound, price_table

__all__ = ["ANTHROPIC", "OPENAI", "Endpoint", "classify", "endpoint_call"]

FREE, TOKENS = "free", "tokens"
IMAGE, CHARACTER, SECOND, REQUEST = "image", "character", "second", "request"
_Units = Callable[[Mapping[str, Any]], int]


class Endpoint(NamedTuple):
    """One POST endpoint of an SDK.

    Attributes:
        name: The SDK method (``"images.generate"``): the call's
            ``gen_ai.operation.name``, and a bound's price key.
        billed: :data:`FREE`, :data:`TOKENS` (the SDK's own reader), a unit
            (:data:`IMAGE`, :data:`CHARACTER`, :data:`SECOND`) or :data:`REQUEST`.
        units: How many units the request bills (unit endpoints).
        variants: Body keys (and defaults) that select the unit price: size, quality.
        default_model: The model the provider uses when the body names none.
        by_model: Whether a bound is priced per model (``"whisper-1"``) rather
            than per endpoint (``"batches"``).
    """

    name: str
    billed: str
    units: _Units | None = None
    variants: tuple[tuple[str, str], ...] = ()
    default_model: str = ""
    by_model: bool = False


def _count(key: str, default: int) -> _Units:
    def units(body: Mapping[str, Any]) -> int:
        value = body.get(key, default)
        try:
            count = int(value if value is not None else default)
        except (TypeError, ValueError):
            return default
        return count if count > 0 else default

    return units


def _characters(body: Mapping[str, Any]) -> int:
    text = body.get("input")
    return len(text) if isinstance(text, str) else 1


def _free(*names: str) -> list[tuple[str, Endpoint]]:
    return [(name, Endpoint(name, FREE)) for name in names]


_IMAGE_VARIANTS = (("size", "1024x1024"), ("quality", "standard"))
_UPLOAD = Endpoint("files.create", FREE)  # free, but a batch input file is read on the way
_VIDEO = Endpoint("videos.create", SECOND, _count("seconds", 4), (("size", "720x1280"),), "sora-2")

# Path template -> endpoint. Templates as the SDK writes them ({id}: one path segment).
_OPENAI: list[tuple[str, Endpoint]] = [
    ("/chat/completions", Endpoint("chat.completions.create", TOKENS)),
    ("/responses", Endpoint("responses.create", TOKENS)),
    ("/completions", Endpoint("completions.create", TOKENS)),
    ("/embeddings", Endpoint("embeddings.create", TOKENS)),
    ("/files", _UPLOAD),
    (
        "/images/generations",
        Endpoint("images.generate", IMAGE, _count("n", 1), _IMAGE_VARIANTS, "dall-e-2"),
    ),
    ("/images/edits", Endpoint("images.edit", IMAGE, _count("n", 1), _IMAGE_VARIANTS, "dall-e-2")),
    (
        "/images/variations",
        Endpoint("images.create_variation", IMAGE, _count("n", 1), _IMAGE_VARIANTS, "dall-e-2"),
    ),
    ("/audio/speech", Endpoint("audio.speech.create", CHARACTER, _characters)),
    ("/videos", _VIDEO),
    ("/videos/edits", _VIDEO._replace(name="videos.edit")),
    ("/videos/extensions", _VIDEO._replace(name="videos.extend")),
    # A remix is as long as its source video, which the request does not show.
    ("/videos/{video_id}/remix", Endpoint("videos.remix", REQUEST)),
    ("/videos/characters", Endpoint("videos.create_character", REQUEST)),
    ("/audio/transcriptions", Endpoint("audio.transcriptions.create", REQUEST, by_model=True)),
    ("/audio/translations", Endpoint("audio.translations.create", REQUEST, by_model=True)),
    ("/batches", Endpoint("batches", REQUEST)),
    ("/fine_tuning/jobs", Endpoint("fine_tuning.jobs", REQUEST)),
    ("/fine_tuning/jobs/{fine_tuning_job_id}/resume", Endpoint("fine_tuning.jobs", REQUEST)),
    ("/fine_tuning/alpha/graders/run", Endpoint("fine_tuning.alpha.graders.run", REQUEST)),
    ("/evals/{eval_id}/runs", Endpoint("evals.runs", REQUEST)),
    ("/threads/runs", Endpoint("beta.threads.runs", REQUEST)),
    ("/threads/{thread_id}/runs", Endpoint("beta.threads.runs", REQUEST)),
    (
        "/threads/{thread_id}/runs/{run_id}/submit_tool_outputs",
        Endpoint("beta.threads.runs", REQUEST),
    ),
    ("/responses/compact", Endpoint("responses.compact", REQUEST, by_model=True)),
    ("/decisions", Endpoint("decisions.create", REQUEST, by_model=True)),
    ("/chatkit/sessions", Endpoint("beta.chatkit.sessions", REQUEST)),
    ("/containers", Endpoint("containers.create", REQUEST)),
    # Sessions that run agents or realtime audio once opened: money spent past this call.
    ("/agents/sessions", Endpoint("beta.agents.sessions", REQUEST)),
    ("/agents/sessions/{session_id}/events", Endpoint("beta.agents.sessions", REQUEST)),
    (
        "/agents/automations/{automation_id}/invocations",
        Endpoint("beta.agents.automations", REQUEST),
    ),
    ("/agents/automations/{automation_id}/resume", Endpoint("beta.agents.automations", REQUEST)),
    ("/realtime/client_secrets", Endpoint("realtime.client_secrets", REQUEST)),
    ("/realtime/translations/client_secrets", Endpoint("realtime.client_secrets", REQUEST)),
    ("/realtime/sessions", Endpoint("realtime.client_secrets", REQUEST)),
    ("/realtime/transcription_sessions", Endpoint("realtime.client_secrets", REQUEST)),
    ("/realtime/calls", Endpoint("realtime.calls", REQUEST)),
    ("/realtime/calls/{call_id}/accept", Endpoint("realtime.calls", REQUEST)),
    ("/live/sessions", Endpoint("live.sessions", REQUEST)),
    ("/live/sessions/{session_id}/accept", Endpoint("live.sessions", REQUEST)),
    ("/live/sessions/{session_id}/fork", Endpoint("live.sessions", REQUEST)),
    *_free(
        "/moderations",  # free of charge
        "/responses/input_tokens",  # a count
        "/responses/{response_id}/cancel",
        "/chat/completions/{completion_id}",  # metadata
        "/batches/{batch_id}/cancel",
        "/fine_tuning/jobs/{fine_tuning_job_id}/cancel",
        "/fine_tuning/jobs/{fine_tuning_job_id}/pause",
        "/fine_tuning/alpha/graders/validate",
        "/evals",
        "/evals/{eval_id}",
        "/evals/{eval_id}/runs/{run_id}/cancel",
        "/threads/{thread_id}/runs/{run_id}/cancel",
        "/threads/{thread_id}/runs/{run_id}",  # metadata
        "/threads",
        "/threads/{thread_id}",
        "/threads/{thread_id}/messages",
        "/threads/{thread_id}/messages/{message_id}",
        "/assistants",
        "/assistants/{assistant_id}",
        "/chatkit/sessions/{session_id}/cancel",
        "/realtime/calls/{call_id}/hangup",
        "/realtime/calls/{call_id}/refer",
        "/realtime/calls/{call_id}/reject",
        "/live/sessions/{session_id}/hangup",
        "/live/sessions/{session_id}/refer",
        "/live/sessions/{session_id}/reject",
        "/agents",
        "/agents/{agent_id}",
        "/agents/automations",
        "/agents/automations/{automation_id}",
        "/agents/automations/{automation_id}/pause",
        "/agents/environments",
        "/agents/environments/templates",
        "/agents/environments/templates/{environment_template_id}",
        "/agents/environments/{environment_id}/files",
        "/agents/sessions/{session_id}",  # metadata
        "/vaults",
        "/vaults/{vault_id}",
        "/vaults/{vault_id}/credentials",
        "/vaults/{vault_id}/credentials/{credential_id}",
        "/audio/voice_consents",
        "/audio/voice_consents/{consent_id}",
        "/audio/voices",
        "/content_provenance_checks",
        "/uploads",
        "/uploads/{upload_id}/cancel",
        "/uploads/{upload_id}/complete",
        "/uploads/{upload_id}/parts",
        "/containers/{container_id}/files",
        "/conversations",  # storage; items are billed when a response reads them
        "/conversations/{conversation_id}",
        "/conversations/{conversation_id}/items",
        # Vector stores bill storage per GB-day, not per call: not contained.
        "/vector_stores",
        "/vector_stores/{vector_store_id}",
        "/vector_stores/{vector_store_id}/file_batches",
        "/vector_stores/{vector_store_id}/file_batches/{batch_id}/cancel",
        "/vector_stores/{vector_store_id}/files",
        "/vector_stores/{vector_store_id}/files/{file_id}",
        "/skills",
        "/skills/{skill_id}",
        "/skills/{skill_id}/versions",
        "/webhook_endpoints",
        "/webhook_endpoints/{webhook_endpoint_id}",
        "/webhook_endpoints/{webhook_endpoint_id}/rotate_secret",
        "/webhook_endpoints/{webhook_endpoint_id}/test",
    ),
]
# Administration (keys, projects, users, limits): never billed per call.
_OPENAI_ADMIN = ("/organization/", "/projects/")

_ANTHROPIC: list[tuple[str, Endpoint]] = [
    ("/v1/messages", Endpoint("messages.create", TOKENS)),
    ("/v1/messages/batches", Endpoint("messages.batches", REQUEST)),
    ("/v1/complete", Endpoint("completions.create", REQUEST, by_model=True)),  # legacy
    ("/v1/sessions", Endpoint("beta.sessions", REQUEST)),
    ("/v1/sessions/{session_id}/events", Endpoint("beta.sessions", REQUEST)),
    ("/v1/deployments/{deployment_id}/run", Endpoint("beta.deployments.run", REQUEST)),
    ("/v1/deployments/{deployment_id}/unpause", Endpoint("beta.deployments.run", REQUEST)),
    ("/v1/dreams", Endpoint("beta.dreams", REQUEST)),
    *_free(
        "/v1/messages/count_tokens",
        "/v1/messages/batches/{message_batch_id}/cancel",
        "/v1/files",
        "/v1/skills",
        "/v1/skills/{skill_id}/versions",
        "/v1/agents",
        "/v1/agents/{agent_id}",
        "/v1/agents/{agent_id}/archive",
        "/v1/compliance/review/cases/{case_id}/respond",
        "/v1/deployments",
        "/v1/deployments/{deployment_id}",
        "/v1/deployments/{deployment_id}/archive",
        "/v1/deployments/{deployment_id}/pause",
        "/v1/dreams/{dream_id}/archive",
        "/v1/dreams/{dream_id}/cancel",
        "/v1/environments",
        "/v1/environments/{environment_id}",
        "/v1/environments/{environment_id}/archive",
        "/v1/environments/{environment_id}/work/{work_id}",
        "/v1/environments/{environment_id}/work/{work_id}/ack",
        "/v1/environments/{environment_id}/work/{work_id}/heartbeat",
        "/v1/environments/{environment_id}/work/{work_id}/stop",
        "/v1/memory_stores",
        "/v1/memory_stores/{memory_store_id}",
        "/v1/memory_stores/{memory_store_id}/archive",
        "/v1/memory_stores/{memory_store_id}/memories",
        "/v1/memory_stores/{memory_store_id}/memories/{memory_id}",
        "/v1/memory_stores/{memory_store_id}/memory_versions/{memory_version_id}/redact",
        "/v1/sessions/{session_id}",  # metadata
        "/v1/sessions/{session_id}/archive",
        "/v1/sessions/{session_id}/resources",
        "/v1/sessions/{session_id}/resources/{resource_id}",
        "/v1/sessions/{session_id}/threads/{thread_id}/archive",
        "/v1/tunnels",
        "/v1/tunnels/{tunnel_id}/archive",
        "/v1/tunnels/{tunnel_id}/certificates",
        "/v1/tunnels/{tunnel_id}/certificates/{certificate_id}/archive",
        "/v1/tunnels/{tunnel_id}/reveal_token",
        "/v1/tunnels/{tunnel_id}/rotate_token",
        "/v1/user_profiles",
        "/v1/user_profiles/{user_profile_id}",
        "/v1/user_profiles/{user_profile_id}/action_urls",
        "/v1/user_profiles/{user_profile_id}/enrollment_url",
        "/v1/user_profiles/{user_profile_id}/providers/google/data_controls",
        "/v1/vaults",
        "/v1/vaults/{vault_id}",
        "/v1/vaults/{vault_id}/archive",
        "/v1/vaults/{vault_id}/credentials",
        "/v1/vaults/{vault_id}/credentials/{credential_id}",
        "/v1/vaults/{vault_id}/credentials/{credential_id}/archive",
        "/v1/vaults/{vault_id}/credentials/{credential_id}/mcp_oauth_validate",
    ),
]
_ANTHROPIC_ADMIN = ("/v1/organizations/",)


class _Table(NamedTuple):
    provider_default: str
    templates: Mapping[str, Endpoint]
    admin: tuple[str, ...]
    patterns: tuple[tuple[re.Pattern[str], Endpoint], ...]
    cache: dict[str, Endpoint]  # URL -> endpoint (bounded: URLs carry ids)


def _table(provider: str, rows: list[tuple[str, Endpoint]], admin: tuple[str, ...]) -> _Table:
    # Most segments first: "/threads/{id}/runs" before "/threads/{id}".
    ordered = sorted(rows, key=lambda row: -row[0].count("/"))
    patterns = tuple(
        (re.compile(re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(path)) + "$"), endpoint)
        for path, endpoint in ordered
    )
    return _Table(provider, dict(rows), admin, patterns, {})


OPENAI = _table("openai", _OPENAI, _OPENAI_ADMIN)
ANTHROPIC = _table("anthropic", _ANTHROPIC, _ANTHROPIC_ADMIN)
_UNKNOWN = Endpoint("", REQUEST)
_CACHE_MAX = 512


def classify(table: _Table, url: str) -> Endpoint:
    """The endpoint a POST to ``url`` reaches: an unknown one is bounded
    (:data:`REQUEST`) under its path."""
    found = table.cache.get(url)
    if found is not None:
        return found
    path = url.split("?", 1)[0]
    found = _UNKNOWN._replace(name=f"POST {path}")
    if any(prefix in path for prefix in table.admin):
        found = Endpoint(path, FREE)
    else:
        for pattern, endpoint in table.patterns:
            if pattern.search(path):
                found = endpoint
                break
    if len(table.cache) >= _CACHE_MAX:
        table.cache.clear()
    table.cache[url] = found
    return found


def _billable(table: _Table, options: Any) -> Endpoint | None:
    """The endpoint of a request to contain here; None: not a POST, free, or a
    token call (the SDK's own reader declined it: no chain)."""
    method = options.method
    if method != "post" and str(method).lower() != "post":
        return None
    url = options.url
    endpoint = table.cache.get(url) or classify(table, str(url))
    billed = endpoint.billed
    if (billed is FREE and endpoint is not _UPLOAD) or billed is TOKENS:
        return None
    return endpoint


def _unit_key(endpoint: Endpoint, body: Mapping[str, Any], model: str) -> str:
    words = [endpoint.billed]
    for key, default in endpoint.variants:
        value = body.get(key)
        words.append(str(value) if value is not None else default)
    return f"{model}#{' '.join(words)}"


def _message_batch_cents(table: PriceTable, provider: str, body: Mapping[str, Any]) -> int | None:
    """The worst case of an Anthropic message batch from its inline requests, in
    cents at the batch rate; None when one cannot be priced."""
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        return None
    nano = 0
    for item in requests:
        params = item.get("params") if isinstance(item, Mapping) else None
        if not isinstance(params, Mapping):
            return None
        model, cap = params.get("model"), params.get("max_tokens")
        if not isinstance(model, str) or type(cap) is not int or cap < 0:
            return None
        prices = table.lookup(provider, model)
        if prices is None:
            return None
        parts = [params.get(key) for key in ("system", "messages", "tools")]
        messages = params.get("messages")
        bound = input_bound(parts, len(messages) if isinstance(messages, list) else 1)
        nano += -(-prices.max_cost_nano(bound, cap) // BATCH_DISCOUNT)
    return -(-nano // 10_000_000)


def read_endpoint(
    ctx: ExecutionContext,
    provider: str,
    endpoint: Endpoint,
    body: Mapping[str, Any],
    deployed: bool = False,
) -> tuple[Request, str]:
    """The call a POST to ``endpoint`` is, and (when it cannot be priced) how to price it.

    ``deployed``: the client names a deployment (Azure), so a body without a
    model is not the provider's default model: it is unpriced.
    """
    model = body.get("model")
    if not isinstance(model, str) or not model:
        model = "" if deployed else endpoint.default_model
    prompt = body.get("prompt", body.get("input"))
    parts = [endpoint.name, model, prompt]  # its signature for the repeat limit
    operation = endpoint.name
    table = price_table(ctx)
    if endpoint.units is not None:
        key = _unit_key(endpoint, body, model or "unknown")
        units = endpoint.units(body)
        request = Request(operation, key, parts, cap=units, priced=bool(model))
        if model and table.lookup(provider, key) is not None:
            return request, ""
        field = f"per_{endpoint.billed}"
        return request._replace(priced=False), (
            f"has no price per {endpoint.billed}: price it in the policy file "
            f'([prices."{provider}:{model or "<model>"}"] {field} = <USD>, the dearest '
            "variant you send), or run it in a chain without max_cost_usd (it counts a step)"
        )
    name = f"{model}" if endpoint.by_model and model else endpoint.name
    cents = None
    if endpoint.name == "messages.batches":
        cents = _message_batch_cents(table, provider, body)
    elif endpoint.name == "batches":
        cents = batch_cents(table, provider, body.get("input_file_id"))
    if cents is not None:
        return Request(operation, f"{name}#cents", parts, cap=max(1, cents)), ""
    key = f"{name}#request"
    bound = table.lookup(provider, key)
    if bound is not None:
        return Request(operation, key, parts, cap=request_bound_cents(bound)), ""
    return Request(operation, key, parts, priced=False), how_to_bound(provider, name)


class EndpointAdapter(ProviderAdapter):
    """Contains a Stainless SDK's requests that its token reader does not route."""

    def __init__(self, table: _Table, provider: str) -> None:
        self.table = table
        self.provider = provider  # type: ignore[misc]  # one instance per SDK

    def read_request(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
    ) -> Request | None:
        options = args[1] if len(args) > 1 else kwargs.get("options")
        endpoint = _billable(self.table, options)
        if endpoint is None or endpoint.billed is FREE:
            return None
        ctx = default_context(otel_context.get_current())
        if ctx is None:
            return None
        body = _body(options)
        deployed = "azure" in type(instance).__name__.lower()  # AzureOpenAI: a deployment
        request, why = read_endpoint(ctx, self.provider, endpoint, body, deployed)
        return request._replace(attributes={_HINT: why}) if why else request

    def unpriced_reason(self, request: Request) -> str:
        return str((request.attributes or {}).get(_HINT) or super().unpriced_reason(request))


_HINT = UNPRICED  # how to price the call (a span attribute of the refusal too)


def _body(options: Any) -> Mapping[str, Any]:
    body = getattr(options, "json_data", None)
    extra = getattr(options, "extra_json", None)
    body = body if isinstance(body, Mapping) else {}
    return {**body, **extra} if isinstance(extra, Mapping) else body


def endpoint_call(table: _Table, provider: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The sync and async wrappers of a Stainless client's ``request`` for what
    its token reader does not route (``wrapped`` is the SDK's ``request``)."""
    adapter = EndpointAdapter(table, provider)
    contained, acontained = wrapper(adapter, "request"), wrapper(adapter, "request", True)

    def request(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        options = args[1] if len(args) > 1 else kwargs.get("options")
        endpoint = _billable(table, options)
        if endpoint is None:
            return wrapped(*args, **kwargs)  # most requests: one cached lookup
        if endpoint is not _UPLOAD:
            return contained(wrapped, instance, args, kwargs)
        # A batch input file uploaded here is read on the way: batches.create
        # then reserves what its lines can bill (see _batch_file).
        lines = read_upload(options)
        result = wrapped(*args, **kwargs)
        if lines is not None:
            remember(result, lines)
        return result

    async def arequest(
        wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        options = args[1] if len(args) > 1 else kwargs.get("options")
        endpoint = _billable(table, options)
        if endpoint is None:
            return await wrapped(*args, **kwargs)
        if endpoint is not _UPLOAD:
            return await acontained(wrapped, instance, args, kwargs)
        lines = read_upload(options)
        result = await wrapped(*args, **kwargs)
        if lines is not None:
            remember(result, lines)
        return result

    return request, arequest


def routed(adapter: ProviderAdapter, table: _Table, is_async: bool = False) -> Callable[..., Any]:
    """A Stainless ``request`` hook: ``adapter`` (the SDK's token calls) for the
    calls its reader routes, the endpoint table (:func:`endpoint_call`) for what
    it passes through: every other billable endpoint, or a free one.

    A call the adapter admitted is a token call: it goes out with no second
    look at the table (the request's route is read once before each LLM call),
    and no frame of the router's own stands between it and the SDK.
    """
    endpoint, aendpoint = endpoint_call(table, adapter.provider)
    return wrapper(adapter, "request", is_async, aendpoint if is_async else endpoint)
