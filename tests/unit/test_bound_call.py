"""A response read after the SDK's request() returned finds the call bound to it."""

from __future__ import annotations

import httpx
import pytest

from veronica_otel import ExecutionConfig, ExecutionContext
from veronica_otel._call_spec import CallSpec
from veronica_otel.instrumentors._admit import admit
from veronica_otel.instrumentors._bounds import BoundedCall
from veronica_otel.instrumentors._common import UNTRACED_SPAN, ContainedCall
from veronica_otel.instrumentors._http_libs import bind, bound_call


def _response() -> httpx.Response:
    return httpx.Response(200, request=httpx.Request("POST", "http://127.0.0.1/v1/x"))


@pytest.mark.parametrize("bounded", [False, True])
def test_the_call_bound_to_a_response_is_found_whatever_its_class(bounded: bool) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx:
        spec = CallSpec("openai", "chat", "gpt-4o-mini", 10, 5, False)
        call = admit(ctx, UNTRACED_SPAN, True, spec)[0]
        if bounded:  # as _adapter admits a call at its configured bound
            call.__class__ = BoundedCall
        response = _response()
        assert bound_call(response) is None  # nothing bound yet
        bind(call, response)
        assert bound_call(response) is call
        call.finish()
        assert ctx.snapshot().steps == 1


def test_nothing_but_a_call_is_taken_from_a_response() -> None:
    response = _response()
    response.request.extensions = {"veronica.call": object()}
    assert bound_call(response) is None
    assert bound_call(None) is None
    assert issubclass(BoundedCall, ContainedCall)
