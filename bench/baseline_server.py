"""The floor to compare against: a one-tool server on the same SDK (mcp.server.mcpserver),
nothing else. `noop` returns a constant without sending any request.

    python bench/baseline_server.py        stdio
"""
from mcp.server.mcpserver import MCPServer

server = MCPServer("baseline")


@server.tool(structured_output=False)
def noop() -> str:
    """Return a constant."""
    return "ok"


if __name__ == "__main__":
    server.run("stdio")
