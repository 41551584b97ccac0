"""A small MCP server over stdio that counts how often its tools really ran.

``search`` and ``broken`` count each run; ``ran`` reports the counts (call it
outside any chain, so asking does not spend a step).
"""

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("counter")
runs = {"search": 0, "broken": 0}


@server.tool()
def search(query: str) -> str:
    runs["search"] += 1
    return f"results for {query}"


@server.tool()
def broken() -> str:
    runs["broken"] += 1
    raise ToolError("the backend is down")


@server.tool()
def ran() -> dict[str, int]:
    return dict(runs)


if __name__ == "__main__":
    server.run("stdio")
