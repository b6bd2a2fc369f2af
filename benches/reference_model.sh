#!/usr/bin/env bash
# Prints the path of the reference streaming model, writing it first if missing: a synthetic
# qwen3_moe with Qwen3-30B-A3B's per-layer MoE shape (36 layers, hidden 2048, 16 query / 4 KV
# heads of 128, 128 experts, top-8, expert FFN 768), experts Q4_0, the rest F16 (12.5 GiB).
#   benches/reference_model.sh [PATH]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL=${1:-$ROOT/target/bench/qwen3moe-30b-a3b-shape.q4_0.gguf}
cd "$ROOT"
cargo build --quiet --bin nightmail
if [[ ! -f $MODEL ]]; then
    mkdir -p "$(dirname "$MODEL")"
    [[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ]] || scripts/fetch-model.sh >&2
    target/debug/nightmail model synth --arch qwen3_moe --layers 36 --experts 128 --top-k 8 --hidden 2048 \
        --expert-ffn 768 --dtype q4_0 --tokenizer-from models/SmolLM2-135M-Instruct.Q4_1.gguf --out "$MODEL" >&2
fi
echo "$MODEL"
