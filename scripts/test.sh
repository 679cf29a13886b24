#!/usr/bin/env bash
# The test command: fetches the assets (models and tokenizers, cached), installs the official
# `openai` Python client into build/venv (from PyPI, cached), builds the wasm plugins into
# their registries, fetches NVRTC (PyPI wheel, for compiling the CUDA kernels), and runs every
# test of the workspace. Extra arguments go to `cargo test`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/fetch-assets.sh
cache="${DSPARK_CACHE:-/var/cache/dspark}"
mkdir -p "$cache/pip" 2>/dev/null || { cache="$HOME/.cache/dspark"; mkdir -p "$cache/pip"; }
if [ ! -x build/venv/bin/python ] || ! build/venv/bin/python -c 'import openai' 2>/dev/null; then
  python3 -m venv build/venv
  build/venv/bin/pip install --quiet --disable-pip-version-check --cache-dir "$cache/pip" 'openai>=1.50,<3'
fi
scripts/build-plugins.sh
# NVRTC compiles the CUDA kernels in the tests (no GPU needed).
nvrtc_lib="$(scripts/fetch-nvrtc.sh)"
export LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cargo test --workspace "$@"
