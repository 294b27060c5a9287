"""The stdio server's memory at rest: its peak RSS (VmHWM) after initialize and tools/list, the
median of five fresh processes, in KiB on stdout. Shared by scripts/check-user-path.sh (the
`cargo install`ed server) and scripts/check-wheel.sh (the portable wheel's), which both hold it
to 10 MiB (docs/benchmarks.md). Neither call reaches an engine.

    python3 scripts/lib/rss-at-rest.py PATH/TO/smol-mcp
"""
import json
import statistics
import subprocess
import sys


def at_rest(binary):
    server = subprocess.Popen([binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)

    def call(id, method, params):
        message = {"jsonrpc": "2.0", "id": id, "method": method, "params": params}
        server.stdin.write(json.dumps(message) + "\n")
        server.stdin.flush()
        while json.loads(server.stdout.readline() or '{"id": "gone"}').get("id") not in (id, "gone"):
            pass

    call(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "rss-at-rest", "version": "0"}})
    server.stdin.write('{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
    call(2, "tools/list", {})
    with open(f"/proc/{server.pid}/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    server.stdin.close()
    server.wait(timeout=30)
    return peak


if len(sys.argv) != 2:
    sys.exit("usage: rss-at-rest.py PATH/TO/smol-mcp")
print(int(statistics.median(at_rest(sys.argv[1]) for _ in range(5))))
