"""Names that cannot be encoded, or could collide, are refused where they are given.

The issue's repro: an agent name holding a lone surrogate was accepted, then
every call under it raised ``UnicodeEncodeError``. Now each constructor
refuses it with a ValueError naming the argument and the value, before
anything is sent (the fake server's ``GET /stats`` says so).
"""

from __future__ import annotations

import httpx2
import openai
import pytest

from veronica_otel import BudgetPool, ExecutionConfig, ExecutionContext, agent
from veronica_otel.testing import FakeLLMServer

SURROGATE = "res\udc80archer"


def _sent(server: FakeLLMServer) -> int:
    return int(httpx2.get(server.base_url + "/stats").json()["total"])


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: agent(SURROGATE, ExecutionConfig(max_steps=2)), "agent name"),
        (lambda: agent("line\nbreak"), "agent name"),
        (lambda: agent("nul\x00"), "agent name"),
        (lambda: ExecutionContext(chain_id=SURROGATE), "chain_id"),
        (lambda: ExecutionContext(chain_id="a/b"), "chain_id"),  # '/' is the agents' kind
        (lambda: ExecutionContext(chain_id=":pools"), "chain_id"),  # the pools' tag
        (lambda: BudgetPool(SURROGATE, max_steps=1), "name"),
        (lambda: BudgetPool("tenant{x}", max_steps=1), "name"),
    ],
)
def test_a_name_that_cannot_be_stored_is_refused_at_construction(
    server: FakeLLMServer, client: openai.OpenAI, make: object, named: str
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=5)):
        with pytest.raises(ValueError, match=f"^{named} must .*got ") as refused:
            make()  # type: ignore[operator]
        client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
    assert repr(SURROGATE) in str(refused.value) or "got '" in str(refused.value)
    assert _sent(server) == 1  # the chain goes on; nothing was sent under the bad name


def test_an_agent_with_a_unicode_name_is_contained(
    server: FakeLLMServer, client: openai.OpenAI
) -> None:
    with (
        ExecutionContext(ExecutionConfig(max_steps=5)),
        agent("исследователь 🔬", ExecutionConfig(max_steps=1)),
    ):
        client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
        with pytest.raises(Exception, match="steps") as denied:
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
            )
    assert getattr(denied.value, "agent", None) == "исследователь 🔬"
    assert _sent(server) == 1
