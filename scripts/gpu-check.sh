#!/usr/bin/env bash
# The CUDA checks, for a GPU machine that has only the NVIDIA driver (no toolkit, no Rust, no
# network). Two steps:
#
#   scripts/gpu-check.sh prepare    # here: release binary + CUBIN for sm_90 into build/gpu-check
#   scripts/gpu-check.sh run        # there: the checks, under 8 minutes
#
# With the `device` tool: run `prepare`, then
#   run(command="bash scripts/gpu-check.sh run", carry=["build/gpu-check"], timeout_s=480)
#
# What `run` checks today: the driver sees the GPU (nvidia-smi), and every CUDA kernel
# (embedding gather, RMSNorm + residual, RoPE in both layouts, SiLU-and-multiply, KV write and
# paged attention with grouped-query heads, the token bitmask on a 152k vocabulary, softmax
# and log-softmax, argmax, top-k/top-p/min-p sampling) against its CPU reference
# (`dspark cuda-check`, exit 1 on any kernel outside tolerance).
#
# Not yet, because the CUDA backend over these kernels is not written (see
# host/src/engine/backend/cuda/mod.rs): CUDA vs CPU greedy parity on SmolLM2 and Qwen2.5,
# decode throughput at batch 1/16/64, and the DSpark benchmark. The models also exceed the
# 64 MiB the device tool carries, so that step will need them placed on the GPU machine.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="$root/build/gpu-check"
arch="${DSPARK_GPU_ARCH:-sm_90}"
case "${1:-}" in
  prepare)
    target="${CARGO_TARGET_DIR:-$root/target}"
    cargo build --release -p dspark-server
    nvrtc_lib="$(scripts/fetch-nvrtc.sh)"
    mkdir -p "$out/cubin"
    cp "$target/release/dspark" "$out/dspark"
    LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      "$out/dspark" cuda-check --compile-only --arch "$arch" --cache-dir "$out/cubin"
    du -sh "$out"
    ;;
  run)
    [ -x "$out/dspark" ] || { echo "gpu-check: $out/dspark is missing; run 'scripts/gpu-check.sh prepare' here and carry build/gpu-check" >&2; exit 2; }
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    timeout 420 "$out/dspark" cuda-check --cache-dir "$out/cubin"
    ;;
  *)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
