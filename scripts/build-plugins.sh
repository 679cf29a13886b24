#!/usr/bin/env bash
# Builds the constraint plugins for wasm32-wasip2 and lays them out as plugin registries:
#   plugins/<name>/{plugin.toml,plugin.wasm}        the built-in plugins (the server's default)
#   build/test-plugins/<name>/{...}                 plugins only the test suite loads
#   build/example-plugins/<name>/{...}              the SDK tutorial's example (examples/)
# Each manifest gets the sha256 of its component. Run by scripts/test.sh and scripts/serve.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
target_dir="${CARGO_TARGET_DIR:-$root/target}"

# rust-toolchain.toml names the wasm32-wasip2 target, but rustup adds a toolchain file's targets
# only when it installs the toolchain: where 1.95.0 was already installed without it, add it.
if command -v rustup >/dev/null && [ ! -d "$(rustc --print sysroot)/lib/rustlib/wasm32-wasip2" ]; then
  echo "build-plugins: adding the wasm32-wasip2 target to $(rustc --version)" >&2
  rustup target add wasm32-wasip2 >&2
fi

builtin=(regex:constraints/regex choice:constraints/choice json-schema:constraints/json-schema tool-call:constraints/tool-call grammar:constraints/grammar)
testonly=(testkit:tests/plugins/testkit)
examples=(iso-duration:examples/iso-duration)


install_plugin() { # name crate_dir registry_dir
  local name="$1" dir="$2" reg="$3" wasm sha
  wasm="$target_dir/wasm32-wasip2/plugin/dspark_plugin_${name//-/_}.wasm"
  [ -f "$wasm" ] || { echo "build-plugins: $wasm was not produced" >&2; exit 1; }
  sha="$(sha256sum "$wasm" | cut -d' ' -f1)"
  mkdir -p "$reg/$name"
  cp "$wasm" "$reg/$name/plugin.wasm.tmp" && mv "$reg/$name/plugin.wasm.tmp" "$reg/$name/plugin.wasm"
  { cat "$dir/plugin.toml"; echo; echo "sha256 = \"$sha\""; } > "$reg/$name/plugin.toml.tmp"
  # sha256 must be a top-level key: put it before the first table header.
  python3 - "$reg/$name/plugin.toml.tmp" "$sha" <<'PY'
import sys
path, sha = sys.argv[1:]
lines = [l for l in open(path).read().splitlines() if not l.startswith('sha256 = ')]
at = next((i for i, l in enumerate(lines) if l.startswith('[')), len(lines))
lines.insert(at, f'sha256 = "{sha}"')
open(path, 'w').write('\n'.join(lines).rstrip() + '\n')
PY
  mv "$reg/$name/plugin.toml.tmp" "$reg/$name/plugin.toml"
  echo "build-plugins: $reg/$name ($(stat -c %s "$wasm") bytes)"
}

# One build per plugin, installed before the next build: cargo unifies features across the
# packages of one build, and the json-schema crate exports its interface as a plugin but not
# when tool-call links it as a library (which also rewrites json-schema's own .wasm).
build_and_install() { # name crate_dir registry_dir
  # Checkouts that share a CARGO_TARGET_DIR share the uplifted .wasm path: a crate cargo
  # thinks fresh may leave another checkout's build there. Touching it makes this checkout's
  # build the one copied (the crate alone recompiles, in seconds).
  touch "$2/src/lib.rs"
  cargo build --quiet --profile plugin --target wasm32-wasip2 -p "dspark-plugin-$1"
  install_plugin "$@"
}
for entry in "${builtin[@]}"; do build_and_install "${entry%%:*}" "${entry#*:}" "$root/plugins"; done
for entry in "${testonly[@]}"; do build_and_install "${entry%%:*}" "${entry#*:}" "$root/build/test-plugins"; done
for entry in "${examples[@]}"; do build_and_install "${entry%%:*}" "${entry#*:}" "$root/build/example-plugins"; done
