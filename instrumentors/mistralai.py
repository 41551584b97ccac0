"""Containment for the ``mistralai`` SDK (3.x).

Usage::

    from veronica_otel.instrumentors.mistralai import MistralAIInstrumentor

    MistralAIInstrumentor().instrument()
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)):
        client.chat.complete(model="mistral-small-latest", messages=[...])

Configuration: limits come from the active :class:`ExecutionContext`, else the
process default chain (zero-code: ``VERONICA_*`` variables). With neither,
calls pass through untouched.

Where it hooks: ``mistralai.client.basesdk.BaseSDK.do_request`` and
``do_request_async``. Every one of the SDK's generated methods (over a
hundred: chat, FIM, agents, embeddings, classifiers, OCR, batch, the beta
conversations, audio, workflows, ...) builds an ``httpx2.Request`` and hands
it to these two, which hold the SDK's retry loop; ``chat.parse`` and the
``extra`` helpers call the same methods. So one hook sees every endpoint, a
new one included, once per call, with the request as it goes on the wire:
the operation is read from its path (``_mistralai_request``), unpriceable
endpoints are refused under a cost ceiling, and a clamp or fallback model is
put into a rebuilt request. Hooking the public methods instead would mean
two hundred hooks, and an endpoint added by a release would pass unseen.

Each HTTP attempt of the SDK's retry loop (``utils/retries.py``, when a
``RetryConfig`` is set) goes through ``httpx2.HTTPTransport.handle_request``,
where the transport hooks (``_attempts``) draw every retry from
``max_retries_total`` before it is sent.

``do_request`` returns the response before the SDK reads it: an HTTP error
status is settled here as a reply billed nothing (the SDK raises its own
error after), a JSON reply's ``usage`` (``prompt_tokens``,
``completion_tokens``) is committed, and a stream's response is held so that
the bytes the SDK's event parser reads pass through the call: the usage of
the final chunk is read, and the stream is cut at the next chunk once the
chain trips.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from ._adapter import HTTPErrorReply, ProviderAdapter, Request, wrapper
from ._common import ContainedCall
from ._hooks import GuardedInstrumentor, Hook, SDKHooks
from ._mistralai_request import body_of, extra_input, route_of, unpriced_model
from ._openai_attributes import response_attributes, stream_attributes
from ._streamed_response import StreamedResponse

__all__ = ["MistralAIInstrumentor"]

_instruments = ("mistralai >= 3.7, < 4",)
_NO_OUTPUT = frozenset(("embeddings", "moderation", "classification"))
_PORTS = {"https": 443, "http": 80}


def _request_arg(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return kwargs["request"] if "request" in kwargs else args[1]


class _MistralAdapter(ProviderAdapter):
    provider = "mistral_ai"

    def read_request(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
    ) -> Request | None:
        request = _request_arg(args, kwargs)
        if request.method != "POST":
            return None
        url = request.url
        route = route_of(url.path)
        if route is None:
            return None
        body = body_of(request)
        named = body.get(route.model_key)
        if route.unpriced is not None:
            model = unpriced_model(route, body)
        else:
            model = named if type(named) is str and named else "unknown"
        parts = [part for part in map(body.get, route.inputs) if part is not None]
        messages = body.get("messages")
        cap = body.get(route.cap) if route.cap is not None else None
        if type(cap) is not int:
            cap = None
        choices = body.get("n")
        stream = kwargs.get("stream", args[3] if len(args) > 3 else False)
        return Request(
            route.operation,
            model,
            parts,
            len(messages) if type(messages) is list else 1,
            cap,
            route.cap is not None and route.unpriced is None,
            choices if type(choices) is int and choices > 1 else 1,
            stream is True,
            extra_input(route, request.content if body else b""),
            {"server.address": url.host, "server.port": url.port or _PORTS.get(url.scheme, 443)},
        )

    def rewrite(
        self,
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        cap: int | None,
        model: str | None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        request = _request_arg(args, kwargs)
        route = route_of(request.url.path)
        body = dict(body_of(request))
        if route is None or not body:
            return args, kwargs
        if cap is not None and route.cap is not None:
            body[route.cap] = cap
        if model is not None and route.model_key == "model":  # an agent's model is its own
            body["model"] = model
        headers = request.headers.copy()
        headers.pop("content-length", None)
        content = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        rebuilt = type(request)(
            request.method,
            request.url,
            headers=headers,
            content=content,
            extensions=request.extensions,
        )
        if "request" in kwargs:
            return args, {**kwargs, "request": rebuilt}
        return (args[0], rebuilt, *args[2:]), kwargs

    def is_stream(self, reply: Any, request: Request) -> bool:
        return request.stream and reply.status_code < 400

    def read_reply(self, call: ContainedCall, reply: Any) -> None:
        status = reply.status_code
        if status >= 400:  # the SDK raises its error once we return it
            call.finish(HTTPErrorReply(status), billed=False)
            return
        if call.request.stream:
            return  # a streamed reply the SDK will not read as a stream: its reservation
        data = reply.json()
        if type(data) is not dict:
            return
        _read_usage(call, data.get("usage"))
        attributes = call.pending_attributes
        if attributes is not None:
            response_attributes(attributes, data)

    def wrap_stream(self, call: ContainedCall, reply: Any, is_async: bool) -> Any:
        return StreamedResponse(reply, call, _read_event)


def _read_usage(call: ContainedCall, usage: object) -> None:
    if type(usage) is not dict:
        return
    output = usage.get("completion_tokens")
    if output is None and call.request.operation in _NO_OUTPUT:
        output = 0
    call.set_usage(usage.get("prompt_tokens"), output)


def _read_event(call: ContainedCall, payload: bytes) -> None:
    try:
        event = json.loads(payload)
    except ValueError:
        return
    if type(event) is not dict:
        return
    if "usage" in event:
        _read_usage(call, event["usage"])
    choices = event.get("choices")
    if type(choices) is list and choices and type(choices[0]) is dict:
        delta = choices[0].get("delta")
        if type(delta) is dict and type(text := delta.get("content")) is str:
            call.add_text(text)
    attributes = call.pending_attributes
    if attributes is not None:
        stream_attributes(attributes, event)


_ADAPTER = _MistralAdapter()
_SIGNATURE = ("hook_ctx", "request", "is_error_status_code", "stream")
_PATCHES = (
    Hook("BaseSDK", "do_request", wrapper(_ADAPTER, "do_request"), _SIGNATURE),
    Hook(
        "BaseSDK",
        "do_request_async",
        wrapper(_ADAPTER, "do_request_async", is_async=True),
        _SIGNATURE,
        (),
        True,
    ),
)
_GUARDS = (("BaseSDK", ("do_request",)), ("BaseSDK", ("do_request_async",)))
_HOOKS = SDKHooks(_instruments[0], "mistralai.client.basesdk", _PATCHES, _GUARDS)


class MistralAIInstrumentor(GuardedInstrumentor):
    """Contains every HTTP API call of the ``mistralai`` SDK in the active chain.

    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when the installed ``mistralai`` is outside the tested range or a hook
    changed; nothing is patched and calls in a chain are refused (fail closed).
    """

    _hooks = _HOOKS
    reports_attempts = True

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments
