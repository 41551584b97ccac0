"""An ``MCPServer`` whose tools count their runs, for tests/integration/test_mcp_instrumentor.py.

Apart from the tests so that ``mcp`` is imported when a test builds one, not when
each pytest-xdist worker collects the test module. ``MCPServer`` finds a tool's
``Context`` parameter by resolving its annotation in this module's globals, so
``Context`` is imported here at the top.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError


class CountingServer:
    """An ``MCPServer`` whose tools record each run (and the ``_meta`` they received)."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.metas: list[dict[str, Any]] = []
        self.server = MCPServer("counting")
        runs = self.runs

        @self.server.tool()
        def search(query: str, limit: int = 5) -> str:
            runs["search"] += 1
            return f"{limit} results for {query}"

        @self.server.tool()
        def broken() -> str:
            runs["broken"] += 1
            raise ToolError("the backend is down")

        @self.server.tool()
        def whoami(ctx: Context) -> str:
            self.metas.append(dict(ctx.request_context.meta or {}))
            return "ok"

        @self.server.tool()
        def unavailable() -> str:
            runs["unavailable"] += 1
            raise MCPError(-32000, "service unavailable")
