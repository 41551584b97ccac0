"""dspy: a runaway ReAct module under its own ``max_iters``, then ours.

Its own cap, ``max_iters``, counts ReAct iterations and then asks the model
to extract an answer (one more call); ours counts every model call and tool
run of the chain. dspy's native client speaks HTTP over its own sockets, which no hook
sees; ``DSPyInstrumentor`` sends every call in a chain through its LiteLLM
backend instead. dspy wraps a model error: ours is the ``__cause__`` of its LM
error (``LMUnexpectedError``, ``LMServerError``). ReAct asks for tools in
its own text fields, so the fake server answers in dspy's chat format with
another ``lookup`` each turn.

Needs ``pip install veronica-otel[openai] dspy``. Runs against the in-process
fake server: python examples/frameworks/dspy_react.py
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch

import dspy
from _compare import compare

from veronica_otel.instrumentors.dspy import DSPyInstrumentor
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

TURN = (
    "[[ ## next_thought ## ]]\nOnce more.\n\n[[ ## next_tool_name ## ]]\nlookup\n\n"
    '[[ ## next_tool_args ## ]]\n{"city": "Paris"}\n\n[[ ## completed ## ]]'
)


def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


def main() -> None:
    OpenAIInstrumentor().instrument()  # LiteLLM sends openai/ models through the openai SDK
    DSPyInstrumentor().instrument()  # in a chain, every call goes through LiteLLM
    with FakeLLMServer(output_tokens=5) as server:
        lm = dspy.LM(
            "openai/gpt-4o-mini", api_base=server.openai_base_url, api_key="fake", cache=False
        )
        dspy.configure(lm=lm)
        react = dspy.ReAct("question -> answer", tools=[lookup], max_iters=10)

        def run() -> object:
            server.set_responder(lambda request: TURN)
            return react(question="go")

        compare("dspy", "max_iters=10", run, server)


if __name__ == "__main__":
    main()
