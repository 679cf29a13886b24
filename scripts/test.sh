#!/usr/bin/env bash
# The test command: fetches the assets (cached), builds the wasm plugins into their
# registries, and runs every test of the workspace. Extra arguments go to `cargo test`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/fetch-assets.sh --tokenizers-only
scripts/build-plugins.sh
cargo test --workspace "$@"
