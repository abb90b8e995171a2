#!/usr/bin/env bash
# Builds the GPU check binary (`examples/gpu_check/`, features `nccl` = `cuda` +
# NCCL) and the CUDA test binary (`tests/gpu.rs`, feature `cuda`) on a machine
# without a GPU, with the pip CUDA 13.0 toolchain of scripts/cuda-toolchain.sh.
#
#   scripts/build-gpu-check.sh
#
# Output (CARGO_TARGET_DIR, default target/gpu):
#   target/gpu/release/examples/gpu_check    the binary
#   target/gpu/gpu_check.xz                  the same without debug info, xz -9 (copy this)
#   target/gpu/gpu-tests.xz                  the tests/gpu.rs binary, likewise
#   target/gpu/language_model.xz             examples/language_model.rs, likewise
#
# Environment: ADABATCH_CUDA_HOME (toolchain folder), CUDA_COMPUTE_CAP (default 90:
# H100/H200), CUDAFORGE_THREADS (default 2), ADABATCH_SKIP_TESTS=1 (skip the test
# binary), ADABATCH_SKIP_CLIPPY=1 (skip clippy on the nccl build).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
say() { printf 'build-gpu-check: %s\n' "$*" >&2; }
step_start=$SECONDS
took() { printf '%ds' "$((SECONDS - step_start))"; }

say "toolchain (scripts/cuda-toolchain.sh)"
"$repo/scripts/cuda-toolchain.sh" >/dev/null
# shellcheck disable=SC1091
source "${ADABATCH_CUDA_HOME:-$HOME/.cache/adabatch/cuda13}/env.sh"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target/gpu}"
say "CUDA_HOME=$CUDA_HOME CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP CUDAFORGE_THREADS=$CUDAFORGE_THREADS CARGO_TARGET_DIR=$CARGO_TARGET_DIR"

step_start=$SECONDS
say "cargo build --release --features nccl --example gpu_check"
cargo build --release --features nccl --example gpu_check
bin="$CARGO_TARGET_DIR/release/examples/gpu_check"
[[ -x "$bin" ]] || {
    say "error: $bin was not produced"
    exit 1
}
say "built in $(took): $(du -h "$bin" | cut -f1)"

# The binary must link the CUDA libraries dynamically and nothing from this machine
# that the GPU machine lacks.
needed="$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
say "NEEDED: $needed"
for lib in libcuda.so.1 libnccl.so.2; do
    [[ " $needed " == *" $lib "* ]] || {
        say "error: $bin does not link $lib"
        exit 1
    }
done
# Every linked library must be one the GPU machine has: the driver's libcuda, a
# library of the pip CUDA wheels (found under $CUDA_HOME or the NCCL wheel), or a
# system library.
# Both lists are read whole before matching: under pipefail, `ldconfig -p | grep -q`
# fails whenever grep's early exit kills ldconfig with SIGPIPE.
system_libs="$(ldconfig -p)"
for lib in $needed; do
    [[ "$lib" == libcuda.so.1 ]] && continue
    wheel_libs="$(find "$CUDA_HOME/lib" "$CUDA_HOME/../nccl/lib" -maxdepth 1 -name "$lib" 2>/dev/null || true)"
    if [[ -z "$wheel_libs" ]] && ! grep -q "[[:space:]]$lib " <<<"$system_libs"; then
        say "error: $bin links $lib, which neither the CUDA wheels nor the system provide"
        exit 1
    fi
done

# Compress a copy without debug info (symbols stay, so backtraces keep function
# names): about a third of the size to carry.
pack() {
    local src="$1" out="$2" tmp
    tmp="$(mktemp "$CARGO_TARGET_DIR/pack.XXXXXX")"
    objcopy --strip-debug "$src" "$tmp"
    xz -9 -T2 -f -c "$tmp" >"$out"
    rm -f "$tmp"
}

step_start=$SECONDS
pack "$bin" "$CARGO_TARGET_DIR/gpu_check.xz"
say "compressed in $(took): $CARGO_TARGET_DIR/gpu_check.xz ($(du -h "$CARGO_TARGET_DIR/gpu_check.xz" | cut -f1))"

# The language-model example on CUDA (`--device cuda`), for its GPU runs beside
# transformers (docs/guide/gpu.md); the same features, so only the example is built.
step_start=$SECONDS
say "cargo build --release --features nccl --example language_model"
cargo build --release --features nccl --example language_model
pack "$CARGO_TARGET_DIR/release/examples/language_model" "$CARGO_TARGET_DIR/language_model.xz"
say "language_model in $(took): $CARGO_TARGET_DIR/language_model.xz ($(du -h "$CARGO_TARGET_DIR/language_model.xz" | cut -f1))"

if [[ "${ADABATCH_SKIP_TESTS:-0}" != 1 ]]; then
    step_start=$SECONDS
    say "cargo test --release --features nccl --test gpu --no-run"
    # Same profile and features as the example, so nothing but the test is rebuilt.
    tests_out="$(cargo test --release --features nccl --test gpu --no-run --message-format=json |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)"
    [[ -n "$tests_out" && -x "$tests_out" ]] || {
        say "error: the tests/gpu.rs binary was not produced"
        exit 1
    }
    pack "$tests_out" "$CARGO_TARGET_DIR/gpu-tests.xz"
    say "test binary in $(took): $CARGO_TARGET_DIR/gpu-tests.xz ($(du -h "$CARGO_TARGET_DIR/gpu-tests.xz" | cut -f1))"

    # Run here what needs no GPU: the runtime's unit tests with `nccl` on, and
    # tests/gpu.rs (which must skip), against the link stub (every driver call
    # answers CUDA_ERROR_NO_DEVICE).
    step_start=$SECONDS
    stub_path="$CUDA_HOME/lib/stubs:$LD_LIBRARY_PATH"
    say "cargo test --release --features nccl -p adabatch-runtime -p adabatch-nn --lib (no GPU: link stub)"
    LD_LIBRARY_PATH="$stub_path" cargo test --release --features nccl -p adabatch-runtime -p adabatch-nn --lib -q
    LD_LIBRARY_PATH="$stub_path" "$tests_out" --test-threads 1 -q
    say "tests without a GPU passed in $(took)"
fi

if [[ "${ADABATCH_SKIP_CLIPPY:-0}" != 1 ]]; then
    step_start=$SECONDS
    say "cargo clippy --release --features nccl (adabatch, -runtime, -nn) --lib --example gpu_check --example language_model --test gpu -- -D warnings"
    cargo clippy --release --features nccl -p adabatch -p adabatch-runtime -p adabatch-nn --lib \
        --example gpu_check --example language_model --test gpu -- -D warnings
    say "clippy clean in $(took)"
fi

say "done. On the GPU machine: see docs/guide/gpu.md"
