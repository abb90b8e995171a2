#!/usr/bin/env bash
# Every CUDA kernel of adabatch-nn/kernels/ executed on the CPU, against its CPU
# twin, through the project's harness of the CUDA programming model
# (adabatch-nn/kernels/harness/; what it models and what it cannot see is in
# cuda_cpu.h):
#
#   1. the checks (adabatch-nn's `kernels_on_cpu` tests, feature `kernels-on-cpu`)
#      in all four dtypes, and that every entry point of the kernels ran;
#   2. the same under AddressSanitizer (out-of-bounds global memory, and shared
#      arrays: each has a redzone), in f32 and f64;
#   3. the same under ThreadSanitizer (a missing barrier is a race whatever the
#      schedule), in f32 and f64.
#
#   scripts/kernels-on-cpu.sh          no arguments; exits non-zero on any mismatch,
#                                      sanitizer report, deadlock or unrun kernel
#
# Needs g++ and nm (binutils), nothing else: no GPU, no CUDA. About 15 minutes cold
# on 2 cores (candle's build is shared with `cargo test --workspace`'s, in target/
# unless CARGO_TARGET_DIR says otherwise). Any edit under
# adabatch-nn/kernels/ is recompiled, whatever the files' times say (a digest of
# their contents reaches build.rs).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
say() { printf 'kernels-on-cpu: %s\n' "$*" >&2; }
start=$SECONDS

ADABATCH_KERNELS_DIGEST="$(cd adabatch-nn && find kernels -type f -print0 | LC_ALL=C sort -z |
    xargs -0 sha256sum | sha256sum | cut -d' ' -f1)"
export ADABATCH_KERNELS_DIGEST
export PROPTEST_DISABLE_FAILURE_PERSISTENCE=1
# A stalled launch fails after this many seconds without progress at a barrier.
export ADABATCH_HARNESS_WATCHDOG_S="${ADABATCH_HARNESS_WATCHDOG_S:-300}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

tests=(cargo test -p adabatch-nn --features kernels-on-cpu --lib)

# The test binary a `cargo test` of the current settings builds.
test_binary() {
    "${tests[@]}" --no-run --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1
}

# Runs the checks with the environment given; fails on any failed test.
run_checks() {
    local label="$1"
    shift
    local step=$SECONDS
    say "$label: building"
    env "$@" "${tests[@]}" --no-run -q
    say "$label: running"
    env "$@" "${tests[@]}" -q kernels_on_cpu:: -- --test-threads 2
    say "$label: passed in $((SECONDS - step)) s"
}

# 1. Plain, every dtype, and the coverage of the entry points.
launched="$work/launched"
run_checks "checks" ADABATCH_KERNELS_SANITIZER= ADABATCH_KERNELS_LAUNCHED="$launched"
binary="$(ADABATCH_KERNELS_SANITIZER= test_binary)"
nm -P "$binary" | awk '$2 == "T" && $1 ~ /^adabatch_/ && $1 !~ /^adabatch_harness_/ { print $1 }' |
    LC_ALL=C sort -u >"$work/entries"
LC_ALL=C sort -u "$launched" >"$work/ran"
count="$(wc -l <"$work/entries")"
[[ "$count" -gt 0 ]] || {
    say "error: no kernel entry point found in $binary"
    exit 1
}
missing="$(LC_ALL=C comm -23 "$work/entries" "$work/ran")"
if [[ -n "$missing" ]]; then
    say "error: entry points no check ran:"
    printf '  %s\n' $missing >&2
    exit 1
fi
say "all $count entry points ran"

# 2. and 3. Under the sanitizers, f32 and f64 (the findings do not depend on the
# element type; the two take both of the attention kernels' tile sizes).
# rustc's link puts the ASan runtime after other libraries; nothing before it
# replaces malloc, so its order check is off.
run_checks "AddressSanitizer" ADABATCH_KERNELS_SANITIZER=address ADABATCH_KERNELS_DTYPES=wide \
    ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:exitcode=86:verify_asan_link_order=0
# Only the harness's code is instrumented: the accesses of memcpy and memset
# (Rust's, candle's thread pool's) are left out, as that pool's synchronisation is
# not TSan's to see.
run_checks "ThreadSanitizer" ADABATCH_KERNELS_SANITIZER=thread ADABATCH_KERNELS_DTYPES=wide \
    TSAN_OPTIONS=ignore_interceptors_accesses=1:halt_on_error=1:exitcode=86:report_signal_unsafe=0

say "passed in $((SECONDS - start)) s"
