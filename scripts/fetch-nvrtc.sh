#!/usr/bin/env bash
# Fetches NVRTC (the CUDA run-time compiler) from the PyPI wheel nvidia-cuda-nvrtc-cu12 into
# the git-ignored build/nvrtc/lib, sha256-checked, cached outside the clone like the other
# downloads. The CUDA kernels are compiled with it in the tests (no GPU needed to compile),
# and scripts/gpu-check.sh carries it to the GPU machine. Prints the lib folder; put it on
# LD_LIBRARY_PATH (scripts/test.sh does).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version="12.8.93"
wheel="nvidia_cuda_nvrtc_cu12-${version}-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl"
sha="a7756528852ef889772a84c6cd89d41dfa74667e24cca16bb31f8f061e3e9994"
cache="${DSPARK_CACHE:-/var/cache/dspark}/downloads/pypi"
mkdir -p "$cache" 2>/dev/null || { cache="$HOME/.cache/dspark/downloads/pypi"; mkdir -p "$cache"; }
lib="$root/build/nvrtc/lib"
if [ ! -f "$lib/libnvrtc.so.12" ] || [ "$(cat "$lib/.version" 2>/dev/null)" != "$version" ]; then
  if [ ! -f "$cache/$wheel" ] || [ "$(sha256sum "$cache/$wheel" | cut -d' ' -f1)" != "$sha" ]; then
    python3 -m pip download --no-deps --quiet --disable-pip-version-check --only-binary=:all: \
      --platform manylinux2010_x86_64 --python-version 3 -d "$cache" "nvidia-cuda-nvrtc-cu12==$version" >&2
  fi
  got="$(sha256sum "$cache/$wheel" | cut -d' ' -f1)"
  [ "$got" = "$sha" ] || { echo "fetch-nvrtc: $wheel has sha256 $got, expected $sha" >&2; exit 1; }
  rm -rf "$lib" && mkdir -p "$lib"
  python3 - "$cache/$wheel" "$lib" <<'PY'
import os, sys, zipfile
whl, lib = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith("nvidia/cuda_nvrtc/lib/") and ".so" in name:
            with open(os.path.join(lib, os.path.basename(name)), "wb") as f:
                f.write(z.read(name))
PY
  echo "$version" > "$lib/.version"
fi
echo "$lib"
