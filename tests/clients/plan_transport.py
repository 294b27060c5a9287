"""What the Python client scripts share: the transport a plan names (`url` and `token` for
Streamable HTTP, else `server` and `env` for stdio) and a tool result's structured content."""

from typing import Any

from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def transport_of(plan: dict[str, Any]) -> Any:
    """The server the plan names: over HTTP with its bearer token, or spawned over stdio."""
    if "url" in plan:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {plan['token']}"})
        return streamable_http_client(plan["url"], http_client=http)
    return StdioServerParameters(command=plan["server"], args=[], env=plan.get("env"))


def structured(result: Any) -> dict[str, Any]:
    """A tool result's structured content; a tool error raised with its text."""
    if result.is_error:
        text = "\n".join(getattr(block, "text", "") for block in result.content)
        raise RuntimeError(f"tool error: {text}")
    return result.structured_content
