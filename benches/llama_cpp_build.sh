#!/usr/bin/env bash
# Build llama.cpp's CLI tools (llama-bench, llama-completion) from the llama.cpp vendored in PyPI's
# llama-cpp-python sdist, for benches/llama_cpp.sh. Idempotent: the sdist, the unpacked tree and
# the CMake build are reused when present; a second run only lets CMake check what is up to date.
#
#   benches/llama_cpp_build.sh            (env: LLAMA_CPP_DIR, default target/llama.cpp; JOBS, default 2)
#
# Prints the directory of the built binaries on its last line.
#
# Notes:
# - `pip download --no-binary :all:` also forces pip to build the sdist's *build* dependencies
#   (cmake, ninja, scikit-build-core) from source in order to prepare its metadata: cmake compiles
#   for a long time. `--no-binary llama-cpp-python` gets the same sdist in ~15 s.
# - The CPU flags pin AVX2/FMA/F16C and keep AVX512/AMX off: the default (GGML_NATIVE) build
#   crashes on the CPUs we bench on. GGML_CPU_REPACK stays ON (default) so the runner can compare
#   repack on/off at run time (--repack 0|1 / --no-repack).
# - Runs under `nice -n 15` with at most 2 jobs: this machine is shared with Rust builds.
set -euo pipefail

VERSION=0.3.36
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${LLAMA_CPP_DIR:-$ROOT/target/llama.cpp}
JOBS=${JOBS:-2}
SRC=$DIR/src/llama_cpp_python-$VERSION/vendor/llama.cpp
BUILD=$DIR/build
TARGETS=(llama-bench llama-completion)

need_pkgs=()
command -v cmake >/dev/null 2>&1 || need_pkgs+=(cmake)
command -v g++ >/dev/null 2>&1 || need_pkgs+=(g++)
command -v make >/dev/null 2>&1 || need_pkgs+=(make)
if ((${#need_pkgs[@]})); then
    echo "llama_cpp_build: installing ${need_pkgs[*]} with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q "${need_pkgs[@]}" >&2
fi

pip_cmd=(pip)
command -v pip >/dev/null 2>&1 || pip_cmd=(python3 -m pip)

mkdir -p "$DIR/sdist" "$DIR/src"
tarball=$DIR/sdist/llama_cpp_python-$VERSION.tar.gz
if [[ ! -f $tarball ]]; then
    "${pip_cmd[@]}" download --quiet --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$VERSION" -d "$DIR/sdist" >&2
fi
if [[ ! -f $SRC/CMakeLists.txt ]]; then
    rm -rf "$DIR/src/llama_cpp_python-$VERSION"
    tar -xzf "$tarball" -C "$DIR/src"
fi

# Only (re)configure when there is no cache yet, so repeated runs are cheap.
if [[ ! -f $BUILD/CMakeCache.txt ]]; then
    nice -n 15 cmake -S "$SRC" -B "$BUILD" \
        -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
        -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >&2
fi
start=$(date +%s)
nice -n 15 cmake --build "$BUILD" --config Release -j "$JOBS" --target "${TARGETS[@]}" >&2
echo "llama_cpp_build: build step took $(($(date +%s) - start)) s" >&2
for t in "${TARGETS[@]}"; do
    [[ -x $BUILD/bin/$t ]] || { echo "llama_cpp_build: $BUILD/bin/$t missing" >&2; exit 1; }
    echo "llama_cpp_build: $BUILD/bin/$t" >&2
done
echo "$BUILD/bin"
