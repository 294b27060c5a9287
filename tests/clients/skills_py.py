"""The server's skills (the MCP skills extension, SEP-2640) through the official Python MCP client
(mcp 2.3.0), which has no skills helpers: skills/list and skills/get go through the client's
generic request (`session.send_request`), each skill's file through its own resources/read and
resources/list, on the lifecycle the plan names.

Usage: skills_py.py PLAN_JSON
PLAN_JSON: {"server": path, "env": {...}, "mode": "legacy" | "auto"} for stdio, or
{"url": ..., "token": ..., "mode": ...} for HTTP.
Prints one JSON object: the protocol version, the extension's settings in the server's
capabilities, whether the instructions point at skill://, the listed skills, and per skill what
skills/get answered and whether the file read matches its manifest (sha256 and size); then the
error of a skills/get of a skill that does not exist and of one that the settings leave out.
"""

import asyncio
import hashlib
import json
import sys
from typing import Any, Literal

from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import PaginatedRequest, Request, RequestParams, Result
from plan_transport import transport_of

SKILLS = "io.modelcontextprotocol/skills"


class ListSkills(PaginatedRequest[Literal["skills/list"]]):
    method: Literal["skills/list"] = "skills/list"


class SkillsPage(Result):
    skills: list[dict[str, Any]]
    next_cursor: str | None = None


class GetSkillParams(RequestParams):
    uri: str


class GetSkill(Request[GetSkillParams, Literal["skills/get"]]):
    method: Literal["skills/get"] = "skills/get"
    name_param = "uri"


class OneSkill(Result):
    skill: dict[str, Any]


async def error_of(client: Client, uri: str) -> dict[str, Any] | None:
    try:
        await client.session.send_request(GetSkill(params=GetSkillParams(uri=uri)), OneSkill)
    except MCPError as e:
        return {"code": e.error.code, "message": e.error.message}
    return None


async def main() -> None:
    plan = json.loads(sys.argv[1])
    transport = transport_of(plan)
    out: dict[str, Any] = {}
    async with Client(transport, mode=plan["mode"]) as client:
        out["protocol"] = client.protocol_version
        extensions = client.server_capabilities.extensions or {}
        out["extension"] = extensions.get(SKILLS)
        out["instructionsPointAtSkills"] = "skill://" in (client.instructions or "")
        page = await client.session.send_request(ListSkills(), SkillsPage)
        out["listed"] = page.skills
        resources = await client.list_resources()
        listed_uris = {r.uri: r for r in resources.resources}
        out["skills"] = []
        for skill in page.skills:
            got = await client.session.send_request(
                GetSkill(params=GetSkillParams(uri=skill["uri"])), OneSkill
            )
            read = await client.read_resource(skill["uri"])
            text = read.contents[0].text
            data = text.encode()
            manifest = {f["uri"]: f for f in skill["resources"]}
            own = manifest.get(skill["uri"], {})
            resource = listed_uris.get(skill["uri"])
            out["skills"].append(
                {
                    "uri": skill["uri"],
                    "name": skill["frontmatter"]["name"],
                    "getMatchesList": got.skill == skill,
                    "digestMatches": own.get("digest") == "sha256:" + hashlib.sha256(data).hexdigest(),
                    "sizeMatches": own.get("size") == len(data),
                    "mimeType": read.contents[0].mime_type,
                    "inResourcesList": resource is not None,
                    "resourceMimeType": resource.mime_type if resource else None,
                    "bytes": len(data),
                    "startsWithFrontmatter": text.startswith("---\n"),
                }
            )
        out["unknown"] = await error_of(client, "skill://no-such-skill/SKILL.md")
        out["notOffered"] = await error_of(client, "skill://workspace-in/SKILL.md")
    print(json.dumps(out))


asyncio.run(main())
