"""Calls an agent makes in the agent-limit tests, told apart by the server's recorded prompts."""

from __future__ import annotations

import openai

from veronica_otel.testing import FakeLLMServer

CHAT = "/v1/chat/completions"


def ask(client: openai.OpenAI, who: str) -> None:
    """One chat call whose prompt opens with ``who:`` (the agent's name)."""
    client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": f"{who}: go"}], max_tokens=8
    )


def sent_by(server: FakeLLMServer, who: str) -> int:
    """Requests the server received from agent ``who`` (its name opens the prompt)."""
    return sum(
        1
        for r in server.requests
        if r.path == CHAT and r.body["messages"][0]["content"].startswith(f"{who}:")
    )
