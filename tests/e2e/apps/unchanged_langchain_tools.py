"""A LangChain tool loop that knows nothing about veronica-otel.

Run under ``opentelemetry-instrument``: the distro contains the tool calls
as soon as ``langchain_core`` is imported.
"""

from langchain_core.tools import tool


@tool
def search(query: str) -> str:
    """Search for something."""
    return f"results for {query}"


for step in range(5):
    search.invoke({"query": f"step {step}"})
    print("step", step, "ok", flush=True)
