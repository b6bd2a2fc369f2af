#!/usr/bin/env bash
# Kimi K3's expert shape on this machine (issue 16 §2 figures): a synthetic kimi_k3 with K3's
# per-expert shape (latent 3584 = hidden 7168 / 2, expert FFN 3072, MXFP4: 17.5 MB an expert) and
# top-16, but few layers and experts, then `model bench` (s/token over the I/O floor it measures)
# and `model plan`'s predictions for it and for the real K3's shape (headers over a hole) on this
# disk and on a 7 GB/s SSD, in 64 GB.
#
#   benches/kimi_k3.sh [--layers 4] [--experts 64] [--cache-mb 512] [--tokens 8] [--model PATH]
#
# Dense weights use 8 heads of 128 (K3 has 96) to keep the spine small. No cgroup and no
# drop_caches: the file is written with its pages dropped, and the bench reads experts O_DIRECT.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LAYERS=4
EXPERTS=64
CACHE_MB=512
TOKENS=8
MODEL=$ROOT/target/bench/kimi-k3-shape.llamacpp-layout.mxfp4.gguf
while (($#)); do
    case $1 in
        --layers) LAYERS=$2; shift 2 ;;
        --experts) EXPERTS=$2; shift 2 ;;
        --cache-mb) CACHE_MB=$2; shift 2 ;;
        --tokens) TOKENS=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        *) sed -n '2,11p' "$0" >&2; exit 2 ;;
    esac
done
NM=$ROOT/target/debug/nightmail
mkdir -p "$(dirname "$MODEL")"
[[ -f $MODEL ]] || "$NM" model synth --arch kimi_k3 --layers "$LAYERS" --experts "$EXPERTS" --top-k 16 \
    --hidden 7168 --expert-ffn 3072 --dtype mxfp4 --heads 8 --head-dim 128 --vocab 4096 --out "$MODEL"
"$NM" model inspect "$MODEL" --memory-mb 3072
"$NM" model bench --model "$MODEL" --cache-mb "$CACHE_MB" --tokens "$TOKENS"
"$NM" model plan "$MODEL" --memory-mb 3072 --batch 1
# The real K3's shape (93 layers, 896 experts top-16, 96 heads, vocab 163840; the spine in F16 where
# K3 has BF16, of the same size) as headers over a hole: 1.5 TB that takes no disk.
FULL=$(dirname "$MODEL")/kimi-k3-full.llamacpp-layout.sparse.gguf
[[ -f $FULL ]] || "$NM" model synth --arch kimi_k3 --layers 93 --experts 896 --top-k 16 --hidden 7168 \
    --expert-ffn 3072 --dtype mxfp4 --heads 96 --head-dim 128 --vocab 163840 --sparse --out "$FULL"
"$NM" model inspect "$FULL" --memory-mb 65536
# The hole reads as zeros from memory, so the disk is not measured on it: give this disk's rate
# (the bench's mean above) and the 7 GB/s SSD's.
DISK_GBPS=${DISK_GBPS:-0.94}
"$NM" model plan "$FULL" --memory-mb 65536 --batch 1 --disk-gbps "$DISK_GBPS"
"$NM" model plan "$FULL" --memory-mb 65536 --batch 1 --disk-gbps 7
