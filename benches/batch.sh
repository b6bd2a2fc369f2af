#!/usr/bin/env bash
# Issue 8's goal in one run: aggregate decode tokens/s of the reference streaming model at
# several batch sizes over batch 1, with the I/O floor of each step and the bound that
# independent, uniform routing puts on an I/O-bound step (batch·k expert uses over the expected
# union of the routes). In a memory cgroup, 2 threads, page cache dropped first.
#
#   benches/batch.sh [--mem-gib 3] [--cache-mb 1536] [--tokens 8] [--batch 1,4,8] [--model PATH]
#
# Needs root (drop_caches, cgroups). Prints the table; exits 0 whatever the figures are.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MEM_GIB=3
CACHE_MB=1536
TOKENS=8
BATCH=1,4,8
MODEL=
while (($#)); do
    case $1 in
        --mem-gib) MEM_GIB=$2; shift 2 ;;
        --cache-mb) CACHE_MB=$2; shift 2 ;;
        --tokens) TOKENS=$2; shift 2 ;;
        --batch) BATCH=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        *) sed -n '2,9p' "$0" >&2; exit 2 ;;
    esac
done
[[ $(id -u) == 0 ]] || { echo "batch.sh: needs root (drop_caches, cgroups)" >&2; exit 1; }
cd "$ROOT"
MODEL=$(benches/reference_model.sh $MODEL)
cg=/sys/fs/cgroup/memory/nightmail-batch-$$
cleanup() { [[ -d $cg ]] && rmdir "$cg" 2>/dev/null || true; }
trap cleanup EXIT
mkdir "$cg"
echo $((MEM_GIB * 1024 * 1024 * 1024)) > "$cg/memory.limit_in_bytes"
sync; echo 3 > /proc/sys/vm/drop_caches
sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" target/debug/nightmail model bench --model "$MODEL" \
    --cache-mb "$CACHE_MB" --tokens "$TOKENS" --batch "$BATCH"
echo "oom kills in the cgroup: $(awk '/oom_kill /{print $2}' "$cg/memory.oom_control")"
