#!/usr/bin/env bash
# The MXFP4 mat-vec against this machine's memory bandwidth and candle's Q4_0 mat-vec, in one run
# of `nightmail model kernel-bench` per shape: a 4096x4096 matrix and the reference model's expert
# matrices (Qwen3-30B-A3B: gate/up 768x2048, down 2048x768), one token (mat-vec) and four (the
# small-batch mat-mul). Each kernel cycles through 2 GiB of weights, several times the last-level
# cache, so the weights come from DRAM; the memory is measured before and after in the same run.
#
#   benches/mxfp4.sh [--working-set-mb 2048] [--passes 5] [--json]
#
# Prints each figure and the ratios; exits 0 whatever they are.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ARGS=()
while (($#)); do
    case $1 in
        --working-set-mb | --passes) ARGS+=("$1" "$2"); shift 2 ;;
        --json) ARGS+=("$1"); shift ;;
        *) sed -n '2,10p' "$0" >&2; exit 2 ;;
    esac
done
cd "$ROOT"
cargo build --quiet --bin nightmail
NM=${CARGO_TARGET_DIR:-$ROOT/target}/debug/nightmail
for shape in "4096 4096 1" "4096 4096 4" "768 2048 1" "2048 768 1"; do
    read -r rows cols tokens <<<"$shape"
    echo "== ${rows}x${cols}, ${tokens} token(s)"
    "$NM" model kernel-bench --rows "$rows" --cols "$cols" --tokens "$tokens" "${ARGS[@]}"
done
