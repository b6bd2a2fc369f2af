#!/usr/bin/env bash
# Writes the model-reader fuzz targets' seed corpora into fuzz/corpus/ (ignored by git) from what the
# repo holds: tiny `model synth` GGUFs, and the reference fixtures' safetensors (tests/fixtures/*).
#   crates/nightmail-tools/fuzz/seeds.sh [path/to/nightmail]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
bin="${1:-$root/target/debug/nightmail}"
mkdir -p "$here/corpus/gguf" "$here/corpus/safetensors"
for arch in qwen3_moe deepseek_v3 kimi_linear; do
  "$bin" model synth --arch "$arch" --layers 2 --experts 4 --top-k 2 --hidden 32 --expert-ffn 32 \
    --heads 2 --kv-heads 1 --head-dim 16 --vocab 16 --out "$here/corpus/gguf/synth-$arch.gguf" >/dev/null
done
# Not the reference fixtures' GGUFs (0.3-1 MB): libFuzzer keeps its corpus in memory, and with
# them it passed 256 MiB after 320 inputs, all of it corpus and ASan quarantine.
# The numbering is CONFIGS' order in fuzz_targets/safetensors.rs.
i=0
for name in llama mixtral qwen2_moe qwen3_moe deepseek_v3 gpt_oss gpt_oss_mxfp4 kimi_linear kimi_k3; do
  weights="$root/tests/fixtures/$name/model.safetensors"
  if [[ -f "$weights" ]]; then
    { printf "\\x$(printf %02x "$i")"; cat "$weights"; } >"$here/corpus/safetensors/fixture-$name"
  fi
  i=$((i + 1))
done
ls -la "$here/corpus/gguf" "$here/corpus/safetensors"
