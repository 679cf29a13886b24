#!/usr/bin/env bash
# Soak: runs `dspark serve` (release build, the default model) for MINUTES under mixed load at
# CONCURRENCY (scripts/soak.py: JSON schema, tool calls, grammars, plain chat, streamed and not,
# client disconnects, config reloads, hostile requests), then stops it with SIGTERM and checks
# it exits 0. Prints the JSON report; exits 1 on a lost request, a 5xx, an invalid answer, KV
# left in use, or a server that did not drain.
#   scripts/soak.sh [MINUTES] [CONCURRENCY]        (defaults: 30, 48)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
minutes="${1:-30}"
concurrency="${2:-48}"
scripts/fetch-assets.sh >/dev/null
scripts/build-plugins.sh >/dev/null
cargo build --quiet --release -p dspark-server
bin="${CARGO_TARGET_DIR:-$root/target}/release/dspark"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat > "$work/models.yaml" <<YAML
apiVersion: gpustack.gg/v1alpha1
kind: Model
metadata:
  name: soak
spec:
  source: file:$root/assets/SmolLM2-135M-Instruct.Q4_1.gguf
  config:
    max_num_seqs: 16
    max_queue: 256
YAML
port=$((20000 + RANDOM % 20000))
"$bin" serve --config "$work/models.yaml" --port "$port" --state-dir "$work/state" --shutdown-timeout 60 \
  2> "$work/server.log" &
server=$!
for _ in $(seq 1 600); do
  grep -q "listening on" "$work/server.log" 2>/dev/null && break
  sleep 0.1
done
status=0
python3 scripts/soak.py --port "$port" --model soak --pid "$server" --config "$work/models.yaml" \
  --minutes "$minutes" --concurrency "$concurrency" || status=$?
kill -TERM "$server"
if wait "$server"; then echo "soak: the server drained and exited 0"; else echo "soak: the server exited $?"; status=1; fi
echo "soak: server error log lines: $(grep -c " ERROR " "$work/server.log" || true)"
exit "$status"
