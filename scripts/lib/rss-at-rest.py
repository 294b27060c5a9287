"""The stdio server's memory at rest: its peak RSS (VmHWM) after initialize and tools/list, the
median of five fresh processes, in KiB on stdout. Shared by scripts/check-user-path.sh (the
`cargo install`ed server) and scripts/check-wheel.sh (the portable wheel's), which both hold it
to 10 MiB (docs/benchmarks.md). Neither call reaches an engine.

The binary's pages are first put out of the page cache (written back, then dropped with
posix_fadvise), so that the first process reads them from disk as any start after the cache
was dropped does. What a file just written leaves in the cache can be large folios, and the
kernel maps a whole folio where a process touches one page of it: the same wheel's server
measured 8.5 to 11.8 MiB in the minutes after pipx wrote it and 7.1 to 7.2 MiB once its pages
were read back (Linux 6.18, ext4; docs/benchmarks.md). The figure is then the layout's, not
how the file came to be on disk.

    python3 scripts/lib/rss-at-rest.py PATH/TO/smol-mcp
"""
import json
import os
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


def drop_cached_pages(binary):
    fd = os.open(os.path.realpath(binary), os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


if len(sys.argv) != 2:
    sys.exit("usage: rss-at-rest.py PATH/TO/smol-mcp")
drop_cached_pages(sys.argv[1])
print(int(statistics.median(at_rest(sys.argv[1]) for _ in range(5))))
