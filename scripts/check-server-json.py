#!/usr/bin/env python3
"""Checks server.json as the MCP registry would before a publish, offline.

    check-server-json.py [SERVER_JSON [README]]

1. Against the registry's schema 2025-12-11 (JSON Schema draft-07), vendored in specs/ and pinned
   by its sha256 here (specs/SOURCES.md says where it came from).
2. The rules the registry keeps in code rather than in the schema (its validators, read for
   this: github.com/modelcontextprotocol/registry, internal/validators): the name's two parts,
   versions that are neither `latest` nor a range, every `{variable}` of a package's transport
   URL naming one of its arguments or environment variables, remotes on https and not on
   loopback, argument names.
3. The README (the package's description on PyPI) carries `mcp-name: <name>` followed by a
   boundary, which the registry looks for on PyPI to decide that the package is this server's.

Prints each problem with where it is, and exits 1 if there is any. Needs `jsonschema` (pinned in
tests/clients/requirements.txt).
"""

import hashlib
import json
import pathlib
import re
import sys

from jsonschema import Draft7Validator

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "specs" / "mcp-registry-server-2025-12-11.schema.json"
SCHEMA_SHA256 = "3fba09590c99f61735d234822279f4223fab9e300c0a81e81c91ab62a4114de0"

NAMESPACE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9.-]*[a-zA-Z0-9]$")
SHORT_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*[a-zA-Z0-9]$")
RANGE = re.compile(r"^[\^~<>=]|(^|\.)[xX*](\.|$)|\s-\s|\|\|")
VARIABLE = re.compile(r"\{([^{}]+)\}")
LOOPBACK = re.compile(r"^https?://(localhost|127\.0\.0\.1|\[::1\]|[^/]*\.localhost)([:/]|$)")


def semantic_problems(server):
    problems = []
    name = server.get("name", "")
    parts = name.split("/")
    if len(parts) != 2 or not NAMESPACE.match(parts[0]) or not SHORT_NAME.match(parts[1]):
        problems.append(f"name: {name!r} is not namespace/name, each starting and ending with a letter or digit")
    for where, version in [("version", server.get("version", ""))] + [
        (f"packages[{i}].version", p.get("version", "")) for i, p in enumerate(server.get("packages", []))
    ]:
        if version == "latest" or RANGE.search(version):
            problems.append(f"{where}: {version!r} is `latest` or a range; the registry takes one exact version")
    for i, package in enumerate(server.get("packages", [])):
        names = {v.get("name") for v in package.get("environmentVariables", [])}
        for arguments in ("packageArguments", "runtimeArguments"):
            for argument in package.get(arguments, []):
                names.add(argument.get("name"))
                names.add(argument.get("valueHint"))
                if argument.get("type") == "named" and re.search(r"[<>$\s]", argument.get("name", "")):
                    problems.append(f"packages[{i}].{arguments}: {argument.get('name')!r} is not a flag name")
        transport = package.get("transport", {})
        url = transport.get("url", "")
        for variable in VARIABLE.findall(url):
            if variable not in names:
                problems.append(
                    f"packages[{i}].transport.url: {{{variable}}} names no argument or environment variable of the package"
                )
        if transport.get("type") == "stdio" and url:
            problems.append(f"packages[{i}].transport: a stdio transport has no url")
    for i, remote in enumerate(server.get("remotes", [])):
        url = remote.get("url", "")
        if not url.startswith("https://") or LOOPBACK.match(url):
            problems.append(f"remotes[{i}].url: {url!r} must be https and not loopback")
        for variable in VARIABLE.findall(url):
            if variable not in remote.get("variables", {}):
                problems.append(f"remotes[{i}].url: {{{variable}}} is not in its variables")
    return problems


def marker_problems(name, readme):
    token = f"mcp-name: {name}"
    at = readme.find(token)
    while at != -1:
        rest = readme[at + len(token):]
        if rest == "" or rest.startswith("-->") or rest.startswith("--!>") or not re.match(r"[A-Za-z0-9._/-]", rest[0]):
            return []
        at = readme.find(token, at + 1)
    return [f"README: no `{token}` followed by a space, a newline, a tag or `-->` (the registry's ownership check on PyPI)"]


def main(argv):
    server_path = pathlib.Path(argv[1]) if len(argv) > 1 else ROOT / "server.json"
    readme_path = pathlib.Path(argv[2]) if len(argv) > 2 else ROOT / "README.md"
    schema_bytes = SCHEMA.read_bytes()
    digest = hashlib.sha256(schema_bytes).hexdigest()
    if digest != SCHEMA_SHA256:
        print(f"{SCHEMA}: sha256 {digest}, not the pinned {SCHEMA_SHA256}")
        return 1
    schema = json.loads(schema_bytes)
    Draft7Validator.check_schema(schema)
    try:
        server = json.loads(server_path.read_text())
    except (OSError, ValueError) as e:
        print(f"{server_path}: {e}")
        return 1
    problems = [
        f"{'/'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
        for e in Draft7Validator(schema).iter_errors(server)
    ]
    problems += semantic_problems(server)
    problems += marker_problems(server.get("name", ""), readme_path.read_text())
    for problem in problems:
        print(f"{server_path.name}: {problem}")
    if not problems:
        print(f"{server_path.name}: valid against the registry's 2025-12-11 schema and its publish rules")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
