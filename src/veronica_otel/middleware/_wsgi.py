"""``VeronicaWSGIMiddleware``: one chain per WSGI request.

The request joins the caller's chain (or starts one from the local
configuration) and is refused with 429 before the application runs when the
pre-flight check fails. The application, and the iteration of the body it
returns, run inside the chain. A ``BudgetExceededError`` raised before the
first body bytes are produced becomes a 429 JSON answer (``start_response``
is called again with ``exc_info``, as PEP 3333 allows); raised later, it
propagates and the server aborts the response. When the budget store
cannot be reached (or admitting the request fails in any other way), the
answer is 503 with a JSON body ``{"error": "budget store unavailable", ...}``
and the application does not run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context

from veronica_otel._config import ExecutionConfig
from veronica_otel._errors import TripEvent
from veronica_otel._grants import MAX_GRANT_BYTES, NonceCache
from veronica_otel._ledger import Ledger
from veronica_otel._policy import PolicyPipeline
from veronica_otel._propagation import CONTEXT_KEY

from ._core import MAX_BAGGAGE_BYTES, Admission, Gate, budget_error, denial_body, refusal

__all__ = ["VeronicaWSGIMiddleware"]

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class VeronicaWSGIMiddleware:
    """Contain every request of a WSGI app in a chain.

    Usage::

        app = VeronicaWSGIMiddleware(app, ExecutionConfig(max_cost_usd=0.5, max_steps=20))

    Takes the same arguments as
    :class:`~veronica_otel.middleware.VeronicaASGIMiddleware`.
    """

    def __init__(
        self,
        app: WSGIApp,
        config: ExecutionConfig | None = None,
        *,
        ledger: Ledger | None = None,
        grant_key: bytes | str | None = None,
        pipeline: PolicyPipeline | None = None,
        max_baggage_bytes: int = MAX_BAGGAGE_BYTES,
        max_grant_bytes: int = MAX_GRANT_BYTES,
        replay_cache: NonceCache | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self.gate = Gate(
            config,
            ledger=ledger,
            grant_key=grant_key,
            pipeline=pipeline,
            max_baggage_bytes=max_baggage_bytes,
            max_grant_bytes=max_grant_bytes,
            replay_cache=replay_cache,
            clock=clock,
        )

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        try:
            admission = self.gate.admit(_headers(environ))
        except Exception as exc:  # the store is down: refuse, never a 500
            status, body, _ = refusal(exc)
            return _answer(start_response, status, body, None, None)
        key = self.gate.key
        if admission.denial is not None:
            return _deny(start_response, admission.denial, admission, key, None)
        started = False

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            nonlocal started
            started = True
            extra = admission.spent_header(key)
            return start_response(status, [*headers, *([extra] if extra else [])], exc_info)

        token = otel_context.attach(admission.otel_context)
        try:
            with admission.ctx:
                result = self.app(environ, start)
        except BaseException as exc:
            error = budget_error(exc)
            if error is None:
                raise
            status, body, _ = refusal(error)
            exc_info = sys.exc_info() if started else None
            return _answer(start_response, status, body, admission.spent_header(key), exc_info)
        finally:
            otel_context.detach(token)
        return _Body(result, admission, key, start_response)


def _headers(environ: dict[str, Any]) -> dict[str, str]:
    return {
        name[5:].replace("_", "-").lower(): str(value)
        for name, value in environ.items()
        if name.startswith("HTTP_")
    }


_STATUS = {429: "429 Too Many Requests", 503: "503 Service Unavailable"}


def _deny(
    start_response: StartResponse,
    trip: TripEvent,
    admission: Admission,
    key: bytes | None,
    exc_info: ExcInfo | tuple[None, None, None] | None,
) -> list[bytes]:
    return _answer(start_response, 429, denial_body(trip), admission.spent_header(key), exc_info)


def _answer(
    start_response: StartResponse,
    status: int,
    body: bytes,
    extra: tuple[str, str] | None,
    exc_info: ExcInfo | tuple[None, None, None] | None,
) -> list[bytes]:
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    if extra is not None:
        headers.append(extra)
    start_response(_STATUS[status], headers, exc_info)
    return [body]


class _Body:
    """The application's body, iterated inside the request's chain."""

    def __init__(
        self,
        result: Iterable[bytes],
        admission: Admission,
        key: bytes | None,
        start_response: StartResponse,
    ) -> None:
        self._result = result
        self._admission = admission
        self._key = key
        self._start_response = start_response
        self._context = otel_context.set_value(CONTEXT_KEY, admission.ctx, admission.otel_context)

    def __iter__(self) -> Iterator[bytes]:
        sent = False
        token = otel_context.attach(self._context)
        try:
            iterator = iter(self._result)
        finally:
            otel_context.detach(token)
        while True:
            denial: list[bytes] | None = None
            token = otel_context.attach(self._context)
            try:
                chunk = next(iterator)
            except StopIteration:
                return
            except BaseException as exc:
                error = budget_error(exc)
                if error is None or sent:
                    raise
                status, body, _ = refusal(error)
                extra = self._admission.spent_header(self._key)
                denial = _answer(self._start_response, status, body, extra, sys.exc_info())
            finally:
                otel_context.detach(token)
            if denial is not None:
                yield from denial
                return
            sent = sent or bool(chunk)
            yield chunk

    def close(self) -> None:
        close = getattr(self._result, "close", None)
        if callable(close):
            token = otel_context.attach(self._context)
            try:
                close()
            finally:
                otel_context.detach(token)
