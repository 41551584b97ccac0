"""An SDK hook over a sync method is a plain function, over anything else a wrapt wrapper."""

from __future__ import annotations

import asyncio
from typing import Any

import wrapt

from veronica_otel.instrumentors._hooks import Hook, _wrap
from veronica_otel.instrumentors._unwrap import is_ours, unwrap_ours


def _ours(seen: list[tuple[Any, Any, Any, Any]]) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        seen.append((wrapped, instance, args, kwargs))
        return "ours", wrapped(*args, **kwargs)

    return wrapper


def test_the_plain_hook_passes_what_wrapt_passes_and_splices_like_it() -> None:
    class Client:
        def request(self, path: str, *, stream: bool = False) -> tuple[str, bool]:
            return path, stream

    original = Client.__dict__["request"]
    seen: list[tuple[Any, Any, Any, Any]] = []
    hook = Hook("Client", "request", _ours(seen), ("path",))
    _wrap(Client, hook)
    hooked = Client.__dict__["request"]
    assert not isinstance(hooked, wrapt.FunctionWrapper)
    assert hooked.__wrapped__ is original and is_ours(Client, "request", hook.wrapper)
    client = Client()
    assert client.request("/v1", stream=True) == ("ours", ("/v1", True))
    wrapped, instance, args, kwargs = seen.pop()
    assert (instance, args, kwargs) == (client, ("/v1",), {"stream": True})
    assert wrapped.__self__ is client and wrapped.__func__ is original  # a bound method
    assert Client.request(client, "/x") == ("ours", ("/x", False))  # through the class too

    # Another instrumentation's wrapper under ours is spliced out; ours then calls
    # what it wrapped, and comes out itself leaving the original.
    def theirs(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        return "theirs", wrapped(*args, **kwargs)

    Client.request = original  # type: ignore[method-assign]
    wrapt.wrap_function_wrapper(Client, "request", theirs)
    _wrap(Client, hook)  # over a method wrapped first by someone else: wrapt, as before
    assert isinstance(Client.__dict__["request"], wrapt.FunctionWrapper)
    assert client.request("/y") == ("ours", ("theirs", ("/y", False)))
    unwrap_ours(Client, "request", hook.wrapper)
    unwrap_ours(Client, "request", theirs)
    assert Client.__dict__["request"] is original

    _wrap(Client, hook)  # plain again, then theirs under it: spliced through it
    hooked = Client.__dict__["request"]
    hooked.__wrapped__ = wrapt.FunctionWrapper(original, theirs)
    assert client.request("/z") == ("ours", ("theirs", ("/z", False)))
    unwrap_ours(Client, "request", theirs)
    assert Client.__dict__["request"] is hooked and hooked.__wrapped__ is original
    assert client.request("/w") == ("ours", ("/w", False))
    unwrap_ours(Client, "request", hook.wrapper)
    assert Client.__dict__["request"] is original


def test_async_static_and_class_methods_keep_the_wrapt_wrapper() -> None:
    class Client:
        async def arequest(self, path: str) -> str:
            return path

        @staticmethod
        def build(path: str) -> str:
            return path

        @classmethod
        def make(cls, path: str) -> str:
            return path

    seen: list[tuple[Any, Any, Any, Any]] = []

    async def awrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        return "ours", await wrapped(*args, **kwargs)

    _wrap(Client, Hook("Client", "arequest", awrapper, ("path",), is_async=True))
    _wrap(Client, Hook("Client", "build", _ours(seen)))
    _wrap(Client, Hook("Client", "make", _ours(seen)))
    for name in ("arequest", "build", "make"):
        assert isinstance(Client.__dict__[name], wrapt.FunctionWrapper), name
    assert asyncio.run(Client().arequest("/a")) == ("ours", "/a")
    assert Client.build("/b") == ("ours", "/b")
    assert Client.make("/c") == ("ours", "/c")


def test_what_a_decorator_set_on_the_method_shows_through_the_plain_hook() -> None:
    class Client:
        def request(self) -> str:
            return "sent"

    Client.request.deprecated_since = "1.0"  # type: ignore[attr-defined]
    seen: list[tuple[Any, Any, Any, Any]] = []
    _wrap(Client, Hook("Client", "request", _ours(seen)))
    assert Client.request.deprecated_since == "1.0"  # type: ignore[attr-defined]
    assert Client.request.__name__ == "request" and Client().request() == ("ours", "sent")
