#!/usr/bin/env bash
# The side-by-side test: dspark (DSpark on) against llama.cpp's `llama-server` on the same
# GGUF file, the same prompts and the same machine, with `dspark bench --compare`.
#
# llama-server runs with 8 slots and continuous batching, one thread per core, 2,048 tokens of
# context per slot (dspark's `max_model_len`), the schema in its own `json_schema` field.
# Flash attention is off by default (LLAMA_FLASH_ATTN=on|off|auto): it is often named as
# llama-server's best setting, but on this 2-core Xeon it decoded SmolLM2 at 13.7 ms a token
# with it and 7.5 ms without (one request, 300-token prompts).
# Both servers stay up for the whole run; `dspark bench` alternates blocks of requests between
# them, so only one works at a time.
#
# Usage: scripts/bench-llama-server.sh [smollm2|qwen25] [extra `dspark bench` arguments]
#   e.g. scripts/bench-llama-server.sh smollm2 --requests 32 --concurrency 8 --records 5 --seed 7
# DSPARK_CONFIG names another model-entry file for dspark (its `*-dspark` entry is benchmarked);
# dspark serve sees this environment, so DSPARK_CPU_KERNELS=avx2 runs it on its AVX2 kernels.
# Needs the release binary (`cargo build --release -p dspark-server`); builds llama-server with
# scripts/build-llama-server.sh and fetches the models with scripts/fetch-assets.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

model="${1:-smollm2}"
shift || true
case "$model" in
  smollm2) gguf=assets/SmolLM2-135M-Instruct.Q4_1.gguf; config=configs/bench-smollm2.yaml; entry=smollm2-dspark ;;
  qwen25) gguf=assets/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf; config=configs/bench-qwen25.yaml; entry=qwen25-dspark ;;
  *) echo "usage: $0 [smollm2|qwen25] [dspark bench arguments]" >&2; exit 2 ;;
esac

target_dir="${CARGO_TARGET_DIR:-$root/target}"
dspark="$target_dir/release/dspark"
[ -x "$dspark" ] || { echo "bench-llama-server: build the release binary first: cargo build --release -p dspark-server" >&2; exit 1; }
scripts/fetch-assets.sh --models-only >&2
scripts/build-plugins.sh >&2
llama_server="$(scripts/build-llama-server.sh | tail -n1)"

dspark_port="${DSPARK_PORT:-8181}"
llama_port="${LLAMA_PORT:-8182}"
logs="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

"$llama_server" -m "$gguf" --host 127.0.0.1 --port "$llama_port" -np 8 -c 16384 -cb -fa "${LLAMA_FLASH_ATTN:-off}" \
  -t "$(nproc)" -tb "$(nproc)" > "$logs/llama-server.log" 2>&1 &
pids+=($!)
"$dspark" serve --config "${DSPARK_CONFIG:-$config}" --port "$dspark_port" > "$logs/dspark.log" 2>&1 &
pids+=($!)

wait_ready() {
  local url="$1" log="$2"
  for _ in $(seq 1 300); do
    if curl -fs "$url/health" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "bench-llama-server: $url did not come up; its log:" >&2
  tail -n 20 "$log" >&2
  exit 1
}
wait_ready "http://127.0.0.1:$llama_port" "$logs/llama-server.log"
wait_ready "http://127.0.0.1:$dspark_port" "$logs/dspark.log"
echo "bench-llama-server: llama-server $("$llama_server" --version 2>&1 | head -n1); logs in $logs" >&2

"$dspark" bench --url "http://127.0.0.1:$dspark_port" --model "$entry" \
  --compare "http://127.0.0.1:$llama_port" --compare-model "$(basename "$gguf")" \
  --compare-schema-field json-schema "$@"
