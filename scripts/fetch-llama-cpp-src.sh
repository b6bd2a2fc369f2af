#!/usr/bin/env bash
# Fetch llama.cpp's tokenizer test files (models/ggml-vocab-*.gguf with their .inp/.out cases,
# MIT) and its copies of models' chat templates (models/templates/*.jinja) from the
# llama-cpp-python 0.3.36 sdist on PyPI, checked by sha256, into target/llama-cpp-src/.
# The tokenizer and chat-template tests read them through NIGHTMAIL_LLAMA_CPP_SRC (scripts/test.sh
# sets it).
# Usage: scripts/fetch-llama-cpp-src.sh   Prints the llama.cpp directory on its last line; does
# nothing when it is already there.
set -euo pipefail

VERSION="0.3.36"
# sha256 of llama_cpp_python-0.3.36.tar.gz as PyPI serves it, observed when this script was written.
SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/target/llama-cpp-src"
src="$dest/llama_cpp_python-$VERSION/vendor/llama.cpp"
# .complete marks an unpacking; one from before the templates were unpacked too is done again.
if [[ -f "$src/.complete" && -d "$src/models/templates" ]]; then
    echo "$src"
    exit 0
fi

# shellcheck source=lib/pip.sh
source "$root/scripts/lib/pip.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The sdist itself (--no-binary for this package only: its build tools may come as wheels).
pip_download "$tmp" --no-binary llama-cpp-python "llama-cpp-python==$VERSION"
sdist="$tmp/llama_cpp_python-$VERSION.tar.gz"
if ! echo "$SHA256  $sdist" | sha256sum --check --status; then
    echo "fetch-llama-cpp-src: llama_cpp_python-$VERSION.tar.gz does not have sha256 $SHA256; refusing to use it" >&2
    exit 1
fi
mkdir -p "$tmp/x"
tar -xzf "$sdist" -C "$tmp/x" --wildcards \
    "llama_cpp_python-$VERSION/vendor/llama.cpp/models/ggml-vocab-*" \
    "llama_cpp_python-$VERSION/vendor/llama.cpp/models/templates/*" \
    "llama_cpp_python-$VERSION/vendor/llama.cpp/LICENSE"
touch "$tmp/x/llama_cpp_python-$VERSION/vendor/llama.cpp/.complete"
mkdir -p "$dest"
rm -rf "$dest/llama_cpp_python-$VERSION.part.$$"
mv "$tmp/x/llama_cpp_python-$VERSION" "$dest/llama_cpp_python-$VERSION.part.$$"
# An unpacking without the templates gives way; another run may have finished first, and either
# copy is the same.
if [[ ! -d "$src/models/templates" ]]; then
    rm -rf "$dest/llama_cpp_python-$VERSION"
fi
mv -T "$dest/llama_cpp_python-$VERSION.part.$$" "$dest/llama_cpp_python-$VERSION" 2>/dev/null \
    || rm -rf "$dest/llama_cpp_python-$VERSION.part.$$"
echo "$src"
