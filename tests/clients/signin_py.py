"""The official Python MCP client signing in to smol-mcp-http by itself: the 401 and its
WWW-Authenticate, the protected resource metadata, the issuer's metadata, dynamic registration,
PKCE and the resource indicator are all the client's (`mcp.client.auth.OAuthClientProvider`);
this script only plays the user's browser, as `plan["user"]`, against the test provider whose
pages answer themselves (tests/clients/oidc_provider.mjs).

Usage: signin_py.py PLAN_JSON
PLAN_JSON: {"url": ..., "user": ..., "mode": "auto"|"legacy", "calls": [{"tool": ..., "args": {...}}],
"clientMetadataUrl": ...}; with clientMetadataUrl the client identifies itself by that Client ID
Metadata Document (the SDK's client_metadata_url) where the provider supports them, instead of
registering.
Prints {"tools", "calls", "subject", "clientId"} (read from the access token the client got).
"""

import asyncio
import base64
import json
import sys
from urllib.parse import parse_qs, quote, urljoin, urlparse

import httpx2
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata

REDIRECT = "http://127.0.0.1:1/callback"


class Memory:
    """The client's token storage, in memory for the one run."""

    def __init__(self) -> None:
        self.tokens = None
        self.client = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens) -> None:
        self.tokens = tokens

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, client_info) -> None:
        self.client = client_info


async def main() -> None:
    plan = json.loads(sys.argv[1])
    landed: dict[str, str] = {}

    async def browse(url: str) -> None:
        # The user opens the URL and signs in; the browser follows the redirects with the
        # cookies they set until one comes back to the client's redirect URI.
        following = f"{url}&login_hint={quote(plan['user'])}"
        async with httpx2.AsyncClient(follow_redirects=False) as browser:
            for _ in range(20):
                if following.startswith(REDIRECT):
                    landed["url"] = following
                    return
                response = await browser.get(following)
                location = response.headers.get("location")
                if not location:
                    raise RuntimeError(f"sign-in stopped at {following}: {response.status_code}")
                following = urljoin(following, location)
        raise RuntimeError("sign-in went through more than 20 redirects")

    async def came_back() -> AuthorizationCodeResult:
        query = parse_qs(urlparse(landed["url"]).query)
        return AuthorizationCodeResult(
            code=query["code"][0],
            state=query.get("state", [None])[0],
            iss=query.get("iss", [None])[0],
        )

    storage = Memory()
    auth = OAuthClientProvider(
        server_url=plan["url"],
        client_metadata=OAuthClientMetadata(
            client_name="smol-mcp sign-in test (Python)",
            redirect_uris=[REDIRECT],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=browse,
        callback_handler=came_back,
        client_metadata_url=plan.get("clientMetadataUrl"),
    )
    transport = streamable_http_client(plan["url"], http_client=create_mcp_http_client(auth=auth))
    out = {"tools": [], "calls": []}
    async with Client(transport, mode=plan.get("mode", "auto")) as client:
        out["tools"] = [tool.name for tool in (await client.list_tools()).tools]
        for call in plan.get("calls", []):
            result = await client.call_tool(call["tool"], call.get("args", {}))
            text = "\n".join(getattr(block, "text", "") for block in result.content)
            out["calls"].append(
                {"isError": bool(result.is_error), "structured": result.structured_content, "text": text}
            )
    payload = storage.tokens.access_token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    out["subject"] = claims["sub"]
    out["clientId"] = claims.get("client_id")
    print(json.dumps(out))


asyncio.run(main())
