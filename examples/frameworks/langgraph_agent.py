"""LangGraph + langchain-openai: a runaway ReAct agent under its recursion limit, then ours.

Its own cap, ``recursion_limit``, counts super-steps of the graph (a model
node and a tool node each), not model calls; ours counts model calls and
tool runs (``LangChainInstrumentor``) of the whole chain.

Needs ``pip install veronica-otel[openai,langchain] langgraph langchain-openai``.
Runs against the in-process runaway fake server: python examples/frameworks/langgraph_agent.py
"""

from __future__ import annotations

from _compare import compare
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

from veronica_otel.instrumentors.langchain import LangChainInstrumentor
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


def main() -> None:
    OpenAIInstrumentor().instrument()
    LangChainInstrumentor().instrument()
    with FakeLLMServer(output_tokens=5, runaway=True) as server:
        model = ChatOpenAI(model="gpt-4o-mini", base_url=server.openai_base_url, api_key="fake")
        graph = create_react_agent(model, [lookup])
        compare(
            "langgraph",
            "recursion_limit=10",
            lambda: graph.invoke({"messages": [("user", "go")]}, {"recursion_limit": 10}),
            server,
        )


if __name__ == "__main__":
    main()
