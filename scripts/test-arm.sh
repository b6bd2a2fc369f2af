#!/usr/bin/env bash
# The ARM part of the test command (`scripts/test.sh --arm`, and part of `scripts/test.sh`): the
# kernel and model tests cross-built once for aarch64 Linux and run under qemu as three CPUs, one
# per kernel path, then `cargo check` of the whole workspace for macOS on Apple Silicon.
# Installs what it needs when missing: rustup's two targets, Debian's cross gcc, qemu-user-static
# and clang.
# qemu proves correctness only: its timings say nothing about a real ARM machine.
set -euo pipefail
cd "$(dirname "$0")/.."

linux=aarch64-unknown-linux-gnu
mac=aarch64-apple-darwin

installed=$(rustup target list --installed)
for target in "$linux" "$mac"; do
  grep -qx "$target" <<<"$installed" || rustup target add "$target"
done

# Not libc6:arm64: with it installed, every thread spawn hangs under qemu-user; the cross libc
# under /usr/aarch64-linux-gnu is what qemu's -L points at.
packages=()
command -v aarch64-linux-gnu-gcc >/dev/null || packages+=(gcc-aarch64-linux-gnu)
[ -e /usr/aarch64-linux-gnu/lib/libc.so.6 ] || packages+=(libc6-dev-arm64-cross)
command -v qemu-aarch64-static >/dev/null || packages+=(qemu-user-static)
# For ring's C in the macOS check below.
command -v clang >/dev/null || packages+=(clang)
if [ ${#packages[@]} -gt 0 ]; then
  # shellcheck source=lib/apt.sh
  source scripts/lib/apt.sh
  apt_install "scripts/test-arm.sh: the ARM tests" --no-install-recommends "${packages[@]}"
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# Built once (the first CPU's run builds, the others reuse it): the crate that holds the kernels
# (nightmail-tensor's unit tests) and the whole-model reference tests that run every kernel a
# fixture's weights need (nightmail-engine's tests/reference.rs, which load and generate through
# nightmail-model). Nothing mail-side: it has no ARM-specific code.
# The reference fixtures of each kernel family: llama (F32 and GGUF), qwen3_moe (MoE routing),
# gpt_oss (MXFP4 experts), kimi_k3 (KDA, latent attention, AttnRes).
fixtures=(llama:: qwen3_moe:: gpt_oss kimi_k3::)

# Each CPU runs the best path it has, named for the tests that check the choice: max (without
# SVE, which the kernels do not use and whose emulation is slow) has dotprod and i8mm like M2 and
# later (the i8mm path: `smmla` for the multi-token kernels, dotprod elsewhere), neoverse-n1
# dotprod without i8mm like M1 (where the i8mm path must be refused), cortex-a72 neither (plain
# NEON).
cpus=(max,sve=off:i8mm neoverse-n1:dotprod cortex-a72:neon)

for entry in "${cpus[@]}"; do
  cpu=${entry%%:*}
  export NIGHTMAIL_ARM_KERNEL=${entry#*:}
  skip=()
  if [ "$NIGHTMAIL_ARM_KERNEL" = neon ]; then
    # candle-core 0.11's NEON quantized mat-vecs run `sdot` without checking for dotprod
    # (quantized/neon.rs), so the comparisons with candle die with SIGILL on a CPU without it;
    # they run under the other two CPUs.
    skip=(--skip candles_kernel)
    echo "scripts/test-arm.sh: under $cpu, not the comparisons with candle's kernels (they need dotprod)"
  fi
  echo "scripts/test-arm.sh: $linux under qemu -cpu $cpu (the $NIGHTMAIL_ARM_KERNEL path)"
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -cpu $cpu -L /usr/aarch64-linux-gnu"
  cargo test --target "$linux" -p nightmail-tensor --lib -- "${skip[@]}"
  cargo test --target "$linux" -p nightmail-engine --test reference -- "${fixtures[@]}"
done
unset NIGHTMAIL_ARM_KERNEL CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER

# The kernel crate as a Mac compiles it (-C target-cpu=apple-m1: dotprod and FP16 known at
# compile time, so the compiler may use them anywhere), for Linux, run under the CPU that has them.
# `cargo rustc` applies the flag to this crate only: its dependencies are the ones built above.
m1_test=$(cargo rustc --target "$linux" -p nightmail-tensor --lib --profile test --message-format=json \
  -- -C target-cpu=apple-m1 | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -n "$m1_test" ] || { echo "scripts/test-arm.sh: no test binary from the apple-m1 build" >&2; exit 1; }
echo "scripts/test-arm.sh: nightmail-tensor built for apple-m1, under qemu -cpu max,sve=off"
qemu-aarch64-static -cpu max,sve=off -L /usr/aarch64-linux-gnu "$m1_test"

# macOS on Apple Silicon: every crate and its tests type-checked, with the metal feature off and
# on (Metal itself cannot run here, and linking needs Apple's SDK). ring's build script compiles
# C for the target: Debian's clang can, given the four headers it includes that Apple's SDK
# would hold, declared here as far as ring uses them. `cargo check` never links, so the objects
# are thrown away: these headers only let the build script finish.
headers="$PWD/target/mac-check-include"
mkdir -p "$headers"
printf '#define TARGET_OS_MAC 1\n#define TARGET_OS_OSX 1\n#define TARGET_OS_IPHONE 0\n' >"$headers/TargetConditionals.h"
printf '#include <stddef.h>\nvoid *memcpy(void *, const void *, size_t);\nvoid *memmove(void *, const void *, size_t);\nvoid *memset(void *, int, size_t);\nint memcmp(const void *, const void *, size_t);\n' >"$headers/string.h"
printf '#include <stddef.h>\nvoid abort(void);\n' >"$headers/stdlib.h"
printf '#define assert(x) ((void)0)\n' >"$headers/assert.h"
export CC_aarch64_apple_darwin=clang
export CFLAGS_aarch64_apple_darwin="-ffreestanding -nostdlibinc -I$headers"
# Warnings are errors here: code that only a Mac compiles is seen by no other check.
export CARGO_TARGET_AARCH64_APPLE_DARWIN_RUSTFLAGS="-D warnings"
# audiopus_sys (libopus, for Opus voice notes) would otherwise build libopus with cmake for the
# Mac; given a library directory it only prints link flags, and a check never links.
export LIBOPUS_LIB_DIR="$headers"
cargo check --workspace --all-targets --target "$mac"
cargo check --workspace --all-targets --target "$mac" --features nightmail-engine/metal
