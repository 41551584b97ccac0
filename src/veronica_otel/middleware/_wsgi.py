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
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context

from veronica_otel._config import ExecutionConfig
from veronica_otel._errors import BudgetExceededError, TripEvent
from veronica_otel._grants import MAX_GRANT_BYTES, GrantKeys, NonceCache
from veronica_otel._ledger import Ledger
from veronica_otel._policy import PolicyPipeline
from veronica_otel._propagation import CONTEXT_KEY

from ._core import (
    MAX_BAGGAGE_BYTES,
    Gate,
    PoolsFor,
    RequestAdmission,
    budget_error,
    denial_body,
    refusal,
    retry_after_header,
)

__all__ = ["VeronicaWSGIMiddleware"]

SPENT_BUFFER_BYTES = 64 * 1024
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class VeronicaWSGIMiddleware:
    """Contain every request of a WSGI app in a chain.

    Usage::

        app = VeronicaWSGIMiddleware(app, ExecutionConfig(max_cost_usd=0.5, max_steps=20))

    Takes the same arguments as
    :class:`~veronica_otel.middleware.VeronicaASGIMiddleware`; ``pools``
    is called with the WSGI environ.
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
        audience: str | Sequence[str] | None = None,
        spent_buffer_bytes: int = SPENT_BUFFER_BYTES,
        pools: PoolsFor | None = None,
    ) -> None:
        if type(spent_buffer_bytes) is not int or spent_buffer_bytes < 0:
            raise ValueError(f"spent_buffer_bytes must be an int >= 0, got {spent_buffer_bytes!r}")
        self.app = app
        self.spent_buffer_bytes = spent_buffer_bytes
        self.gate = Gate(
            config,
            ledger=ledger,
            grant_key=grant_key,
            pipeline=pipeline,
            max_baggage_bytes=max_baggage_bytes,
            max_grant_bytes=max_grant_bytes,
            replay_cache=replay_cache,
            clock=clock,
            audience=audience,
            pools=pools,
        )

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        try:
            admission = self.gate.admit(_headers(environ), environ)
        except Exception as exc:  # the store is down: refuse, never a 500
            status, body, _ = refusal(exc)
            return _answer(start_response, status, body, None, None)
        key = self.gate.key
        if admission.denial is not None:
            return _deny(start_response, admission.denial, admission, key, None)
        started = False
        held = _Held() if admission.grant is not None else None

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            nonlocal started
            if held is not None:  # answered once the body is complete (see _Held)
                held.status, held.headers = status, list(headers)
                return held.chunks.append
            started = True
            return start_response(status, headers, exc_info)

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
            extra = admission.spent_header(key)
            return _answer(start_response, status, body, extra, exc_info, _retry(status, error))
        finally:
            otel_context.detach(token)
        if held is not None:
            held_body = _Body(result, admission, key, start_response)
            return held.answer(held_body, start_response, self.spent_buffer_bytes)
        return _Body(result, admission, key, start_response)


class _Held:
    """A granted request's response, held until its body is complete (up to a limit).

    Then ``start_response`` is called with the signed ``veronica-spent``
    header, which counts everything the application spent while producing
    the body. A longer body is sent on as it comes, with no spend-back: the
    caller commits its whole carve. A trip before the answer starts is a 429.
    """

    def __init__(self) -> None:
        self.status: str | None = None
        self.headers: list[tuple[str, str]] = []
        self.chunks: list[bytes] = []

    def answer(self, body: _Body, start_response: StartResponse, limit: int) -> Iterable[bytes]:
        admission, key = body._admission, body._key
        size = sum(len(chunk) for chunk in self.chunks)
        iterator = body.iterate(held=True)
        complete = False
        try:
            while size <= limit:
                try:
                    chunk = next(iterator)
                except StopIteration:
                    complete = True
                    break
                self.chunks.append(chunk)
                size += len(chunk)
        except BaseException as exc:
            error = budget_error(exc)
            body.close()
            if error is None:
                raise
            status, text, _ = refusal(error)
            extra = admission.spent_header(key)
            return _answer(start_response, status, text, extra, None, _retry(status, error))
        extra = admission.spent_header(key) if complete else None
        start_response(self.status or "200 OK", [*self.headers, *([extra] if extra else [])])
        if complete:
            body.close()
            return self.chunks
        return _Rest(self.chunks, iterator, body)


class _Rest:
    """What was held, then the rest of a body too long to hold."""

    def __init__(self, chunks: list[bytes], iterator: Iterator[bytes], body: _Body) -> None:
        self._chunks = chunks
        self._iterator = iterator
        self._body = body

    def __iter__(self) -> Iterator[bytes]:
        yield from self._chunks
        yield from self._iterator

    def close(self) -> None:
        self._body.close()


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
    admission: RequestAdmission,
    key: GrantKeys | None,
    exc_info: ExcInfo | tuple[None, None, None] | None,
) -> list[bytes]:
    return _answer(
        start_response,
        429,
        denial_body(trip),
        admission.spent_header(key),
        exc_info,
        retry_after_header(trip),
    )


def _retry(status: int, error: BudgetExceededError) -> tuple[str, str] | None:
    return retry_after_header(error.trip) if status == 429 else None


def _answer(
    start_response: StartResponse,
    status: int,
    body: bytes,
    extra: tuple[str, str] | None,
    exc_info: ExcInfo | tuple[None, None, None] | None,
    retry: tuple[str, str] | None = None,
) -> list[bytes]:
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    if extra is not None:
        headers.append(extra)
    if retry is not None:
        headers.append(retry)
    start_response(_STATUS[status], headers, exc_info)
    return [body]


class _Body:
    """The application's body, iterated inside the request's chain."""

    def __init__(
        self,
        result: Iterable[bytes],
        admission: RequestAdmission,
        key: GrantKeys | None,
        start_response: StartResponse,
    ) -> None:
        self._result = result
        self._admission = admission
        self._key = key
        self._start_response = start_response
        self._context = otel_context.set_value(CONTEXT_KEY, admission.ctx, admission.otel_context)

    def __iter__(self) -> Iterator[bytes]:
        return self.iterate(held=False)

    def iterate(self, *, held: bool) -> Iterator[bytes]:
        """The chunks, each produced inside the chain; ``held``: a trip propagates."""
        sent = held
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
                denial = _answer(
                    self._start_response,
                    status,
                    body,
                    extra,
                    sys.exc_info(),
                    _retry(status, error),
                )
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
