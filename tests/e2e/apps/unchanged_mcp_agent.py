"""An MCP agent that knows nothing about veronica-otel: five tool calls in a loop.

Run under ``opentelemetry-instrument``; it starts the counting MCP server of
the integration tests as a subprocess and talks to it over stdio.
"""

import sys
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

SERVER = Path(__file__).parents[2] / "integration" / "apps" / "mcp_counter_server.py"


async def main() -> None:
    params = StdioServerParameters(command=sys.executable, args=[str(SERVER)])
    async with Client(params) as client:
        for step in range(5):
            await client.call_tool("search", {"query": f"step {step}"})
            print("step", step, "ok", flush=True)


anyio.run(main)
