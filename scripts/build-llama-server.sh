#!/usr/bin/env bash
# Builds llama.cpp's `llama-server`, the baseline of the side-by-side benchmark, from the
# package registries alone: the llama.cpp sources vendored in PyPI's `llama-cpp-python` sdist
# (pinned version, sha256 checked) and CMake from PyPI when the machine has none. No web UI
# (it would be downloaded), no curl or OpenSSL; `GGML_NATIVE` so ggml uses every instruction
# set of this CPU, as a user building it here would.
#
# The build is kept outside the clone (DSPARK_CACHE, default /var/cache/dspark) and reused.
# Prints the binary's path on its last line. Takes about 10 minutes on 2 cores the first time.
#
# Usage: scripts/build-llama-server.sh
set -euo pipefail

version=0.3.36
sdist_sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
url="https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-$version.tar.gz"

cache="${DSPARK_CACHE:-/var/cache/dspark}"
mkdir -p "$cache" 2>/dev/null || cache="$HOME/.cache/dspark"
work="$cache/llama-server-$version"
bin="$work/src/build/bin/llama-server"
mkdir -p "$work"

if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

tarball="$work/llama_cpp_python-$version.tar.gz"
if [ ! -f "$tarball" ] || [ "$(sha256sum "$tarball" | cut -d' ' -f1)" != "$sdist_sha" ]; then
  curl -fsSL -o "$tarball.tmp" "$url"
  got="$(sha256sum "$tarball.tmp" | cut -d' ' -f1)"
  if [ "$got" != "$sdist_sha" ]; then
    echo "build-llama-server: sha256 mismatch for llama_cpp_python-$version.tar.gz (want $sdist_sha, got $got)" >&2
    rm -f "$tarball.tmp"
    exit 1
  fi
  mv "$tarball.tmp" "$tarball"
fi

if [ ! -d "$work/src" ]; then
  rm -rf "$work/unpack"
  mkdir -p "$work/unpack"
  tar -xzf "$tarball" -C "$work/unpack" "llama_cpp_python-$version/vendor/llama.cpp"
  mv "$work/unpack/llama_cpp_python-$version/vendor/llama.cpp" "$work/src"
  rm -rf "$work/unpack"
fi

if ! command -v cmake >/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check cmake >&2
fi

cd "$work/src"
cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >&2
cmake --build build --target llama-server -j "$(nproc)" >&2
echo "$bin"
