# What scripts/bench-http-calls.sh, scripts/profile-http.sh and scripts/count-http-instructions.sh
# share: the real pinned `smolvm serve` on a socket of a scratch directory, the load (wrk's
# sessionless 2026-07-28 list-machines with the static token), and starting a build of the
# server against that serve. Sourced, not run; the sourcing script sets `load_name` first, and
# has cd'd to the checkout.

load_die() { echo "$load_name: $*" >&2; exit 1; }

# load_need TOOL...: each tool on PATH, or a clear refusal naming the package.
load_need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || load_die "$tool is needed (Debian's package: apt-get install $tool)"
  done
}

# load_start_serve: the engine in a scratch directory, `$load_work`, its socket
# `$load_work/api.sock`; `load_cleanup` (the sourcing script's EXIT trap) ends what was started.
load_pids=()
load_start_serve() {
  local engine=".smolvm/1.32.2/smol-vmm"
  [ -x "$engine" ] || scripts/fetch-smolvm.sh 1.32.2 >/dev/null
  load_work="$(mktemp -d)"
  SMOLVM_VM_UID_DROP=off "$engine" serve start --listen "unix://$load_work/api.sock" \
    --state-dir "$load_work/state" --guest-rollout-port "$((20000 + RANDOM % 10000))" \
    >/dev/null 2>"$load_work/serve.log" &
  load_pids+=($!)
  for _ in $(seq 100); do [ -S "$load_work/api.sock" ] && return 0; sleep 0.1; done
  load_die "the serve did not listen within 10 s: $(tail -3 "$load_work/serve.log")"
}
load_cleanup() {
  local pid
  for pid in "${load_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  [ -z "${load_work:-}" ] || rm -rf "$load_work"
}

# load_call_script FILE [LUA...]: wrk's script of the call, with extra Lua after it.
load_call_script() {
  local file="$1"
  shift
  cat > "$file" <<'LUA'
wrk.method = "POST"
wrk.headers["authorization"] = "Bearer bench-token"
wrk.headers["content-type"] = "application/json"
wrk.headers["accept"] = "application/json, text/event-stream"
wrk.headers["mcp-protocol-version"] = "2026-07-28"
wrk.headers["mcp-method"] = "tools/call"
wrk.headers["mcp-name"] = "list-machines"
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list-machines","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"wrk","version":"0"}}}}'
LUA
  printf '%s\n' "$@" >> "$file"
}

# load_start_server LABEL PORT CMD...: the server (CMD, a build of smol-mcp-http, perhaps under
# a tool) with the static token on PORT against the serve; its pid in `$load_server`, once it
# answers (it may take a while under valgrind).
load_start_server() {
  local label="$1" port="$2"
  shift 2
  SMOL_MCP_RUNTIME_DIR="$load_work/rt-$label" SMOL_MCP_AUTH_TOKEN=bench-token \
    SMOL_LOCAL_URL="unix://$load_work/api.sock" SMOL_MCP_LOG=warn \
    "$@" --port "$port" >/dev/null 2>"$load_work/$label.log" &
  load_server=$!
  load_pids+=("$load_server")
  for _ in $(seq 300); do
    curl -s -o /dev/null "http://127.0.0.1:$port/" && return 0
    kill -0 "$load_server" 2>/dev/null || load_die "$label exited: $(tail -3 "$load_work/$label.log")"
    sleep 0.2
  done
  load_die "$label did not listen within 60 s"
}
load_stop_server() {
  kill "$load_server" 2>/dev/null || true
  wait "$load_server" 2>/dev/null || true
}
