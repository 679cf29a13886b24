#!/usr/bin/env bash
# Fuzzes one parser of untrusted input for SECONDS on a release build:
#   scripts/fuzz.sh TARGET SECONDS      (scripts/fuzz.sh list names the targets)
# Seeds come from fuzz/corpus/TARGET; a crashing or hanging input is saved under
# fuzz/crashes/TARGET and the script exits 1. A stable-toolchain mutation fuzzer (`dspark
# fuzz`): cargo-fuzz needs a nightly toolchain, which this project does not install.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
target="${1:?usage: scripts/fuzz.sh TARGET SECONDS}"
seconds="${2:-60}"
cargo build --quiet --release -p dspark-server
bin="${CARGO_TARGET_DIR:-$root/target}/release/dspark"
if [ "$target" = list ]; then exec "$bin" fuzz list; fi
exec "$bin" fuzz "$target" --seconds "$seconds"
