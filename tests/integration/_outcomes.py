"""What a user's call came to, and what reached the fake server (its ``GET /stats``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx2

from veronica_otel import BudgetExceededError

if TYPE_CHECKING:
    import openai

    from veronica_otel.testing import FakeLLMServer

__all__ = ["chat", "sent"]


def sent(server: FakeLLMServer) -> int:
    """Requests the server received, asked over HTTP as any client would."""
    return int(httpx2.get(server.base_url + "/stats").json()["total"])


def chat(client: openai.OpenAI, model: str = "gpt-4o-mini") -> str:
    """One chat completion: ``"sent"``, or the denial's reason."""
    try:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
    except BudgetExceededError as exc:
        return exc.reason
    return "sent"
