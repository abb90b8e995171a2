#!/usr/bin/env bash
# Installs a build-only CUDA 13.0 toolchain (nvcc, headers, cudart/cuBLAS/cuRAND/
# NVRTC/NCCL libraries) from PyPI wheels into a local folder, so the `cuda` and
# `nccl` features build on a machine without a GPU or a system CUDA. Nothing here
# runs a kernel: `libcuda.so` is a link stub; the real one comes from the driver
# on the GPU machine.
#
#   scripts/cuda-toolchain.sh          install (idempotent), print the environment
#   source scripts/cuda-toolchain.sh   install, and export the environment here
#
# Folder: ${ADABATCH_CUDA_HOME:-$HOME/.cache/adabatch/cuda13}. Re-running skips
# what is already done. Needs python3 (venv + pip), gcc, and cargo's registry
# holding cudarc (the script runs `cargo fetch` if it does not).

_adabatch_cuda_toolchain_main() {
    set -euo pipefail

    local root="${ADABATCH_CUDA_HOME:-$HOME/.cache/adabatch/cuda13}"
    local venv="$root/venv"
    local python="${PYTHON:-python3}"
    local repo
    repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

    # CUDA 13.0.x to match the CUDA 13.0 driver (580) of the GPU machines: a newer
    # nvcc may emit PTX that driver refuses. NCCL 2.27 matches the `nccl-02027`
    # bindings the `nccl` feature selects.
    local wheels=(
        "nvidia-cuda-nvcc==13.0.88"
        "nvidia-cuda-crt==13.0.88"
        "nvidia-nvvm==13.0.88"
        "nvidia-cuda-runtime==13.0.96"
        "nvidia-cuda-cccl==13.0.85"
        "nvidia-cublas==13.0.2.14"
        "nvidia-curand==10.4.0.35"
        "nvidia-cuda-nvrtc==13.0.88"
        "nvidia-nccl-cu13==2.27.7"
    )

    say() { printf 'cuda-toolchain: %s\n' "$*" >&2; }
    die() {
        say "error: $*"
        return 1
    }

    command -v "$python" >/dev/null || die "$python not found (set PYTHON=...)"
    command -v gcc >/dev/null || die "gcc not found (needed for the libcuda.so link stub)"
    mkdir -p "$root"

    # 1. The venv and the wheels (skipped when the same list is already installed).
    local stamp="$root/.wheels"
    local want
    want="$(printf '%s\n' "${wheels[@]}")"
    if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        say "wheels already installed in $venv"
    else
        say "creating venv $venv"
        "$python" -m venv "$venv" || die "python3 -m venv failed (install the venv module)"
        say "installing ${#wheels[@]} CUDA 13.0 wheels (~1.4 GB download, several minutes)"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
            --no-deps "${wheels[@]}" || die "pip install of the CUDA wheels failed"
        printf '%s\n' "$want" >"$stamp"
    fi

    local sp
    sp="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    local cuda_home="$sp/nvidia/cu13"
    local nccl_dir="$sp/nvidia/nccl"
    [[ -x "$cuda_home/bin/nvcc" ]] || die "nvcc missing at $cuda_home/bin/nvcc: the wheel layout changed"
    [[ -d "$nccl_dir/lib" ]] || die "NCCL missing at $nccl_dir/lib: the wheel layout changed"

    # 2. Unversioned names for the linker (the wheels ship versioned files only).
    local lib="$cuda_home/lib"
    local name target
    for name in cudart cublas cublasLt nvrtc curand; do
        target="$(find "$lib" -maxdepth 1 -name "lib$name.so.*" | sort | head -n 1)"
        [[ -n "$target" ]] || die "lib$name.so.* not found in $lib"
        ln -sfn "$(basename "$target")" "$lib/lib$name.so"
    done
    target="$(find "$nccl_dir/lib" -maxdepth 1 -name 'libnccl.so.*' | sort | head -n 1)"
    [[ -n "$target" ]] || die "libnccl.so.* not found in $nccl_dir/lib"
    ln -sfn "$(basename "$target")" "$nccl_dir/lib/libnccl.so"
    # cudarc links -lnccl from $CUDA_HOME/lib.
    ln -sfn "$target" "$lib/libnccl.so"
    ln -sfn "$nccl_dir/include/nccl.h" "$cuda_home/include/nccl.h"

    # 3. libcuda.so link stub: every cu* symbol cudarc's driver bindings name. Each
    # returns CUDA_ERROR_NO_DEVICE (100), so a CUDA binary run here with the stub on
    # LD_LIBRARY_PATH behaves as on a machine without a GPU (tests skip).
    local cudarc
    cudarc="$(cudarc_source "$repo")" || die "cudarc sources not found in cargo's registry"
    local stubs="$cuda_home/lib/stubs"
    mkdir -p "$stubs"
    local symbols="$stubs/libcuda.symbols"
    cat "$cudarc"/src/driver/sys/*.rs | grep -oE '\bfn cu[A-Za-z0-9_]+\(' |
        sed -e 's/^fn //' -e 's/($//' | sort -u >"$symbols"
    [[ -s "$symbols" ]] || die "no cu* symbols found in $cudarc/src/driver/sys"
    {
        echo "/* Link stub for libcuda.so.1 (generated from $(basename "$cudarc")). */"
        sed -e 's/.*/int &(void) { return 100; \/* CUDA_ERROR_NO_DEVICE *\/ }/' "$symbols"
    } >"$stubs/libcuda_stub.c.new"
    if [[ -f "$stubs/libcuda.so" ]] && cmp -s "$stubs/libcuda_stub.c.new" "$stubs/libcuda_stub.c"; then
        rm -f "$stubs/libcuda_stub.c.new"
        say "libcuda.so stub up to date ($(wc -l <"$symbols") symbols)"
    else
        mv "$stubs/libcuda_stub.c.new" "$stubs/libcuda_stub.c"
        gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stubs/libcuda.so" "$stubs/libcuda_stub.c" ||
            die "gcc failed to build the libcuda.so stub"
        ln -sfn libcuda.so "$stubs/libcuda.so.1"
        say "built libcuda.so stub with $(wc -l <"$symbols") symbols from $(basename "$cudarc")"
    fi

    # 4. The environment, for `source`.
    cat >"$root/env.sh" <<EOF
# Written by scripts/cuda-toolchain.sh: build-time CUDA 13.0 environment.
export CUDA_HOME="$cuda_home"
export PATH="$cuda_home/bin:\${PATH}"
export CUDA_COMPUTE_CAP="\${CUDA_COMPUTE_CAP:-90}"
export CUDAFORGE_THREADS="\${CUDAFORGE_THREADS:-2}"
export LIBRARY_PATH="$cuda_home/lib:$cuda_home/lib/stubs:$nccl_dir/lib\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$cuda_home/lib:$nccl_dir/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
EOF
    [[ "$("$cuda_home/bin/nvcc" --version)" == *"release 13.0"* ]] ||
        die "$cuda_home/bin/nvcc is not CUDA 13.0"
    say "ready: source $root/env.sh"
    cat "$root/env.sh"
}

# The cudarc version candle uses, from Cargo.lock, in cargo's registry sources.
cudarc_source() {
    local repo="$1" version dir
    version="$(awk '/^name = "cudarc"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' "$repo/Cargo.lock")"
    version="${version:-0.19.10}"
    for dir in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-"$version"; do
        [[ -d "$dir/src/driver/sys" ]] && {
            echo "$dir"
            return 0
        }
    done
    (cd "$repo" && cargo fetch --quiet) >&2 || return 1
    for dir in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-"$version"; do
        [[ -d "$dir/src/driver/sys" ]] && {
            echo "$dir"
            return 0
        }
    done
    return 1
}

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
    # Sourced: install in a child shell (so `set -e` does not leak into this one),
    # then export the environment here.
    if bash "${BASH_SOURCE[0]}" >/dev/null; then
        # shellcheck disable=SC1091
        source "${ADABATCH_CUDA_HOME:-$HOME/.cache/adabatch/cuda13}/env.sh"
    else
        echo "cuda-toolchain: installation failed; environment not changed" >&2
        return 1
    fi
else
    _adabatch_cuda_toolchain_main "$@"
fi
