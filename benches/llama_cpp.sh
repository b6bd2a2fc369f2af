#!/usr/bin/env bash
# llama.cpp decode seconds/token on a GGUF model inside a cgroup v1 memory limit, the peer figure
# for `nightmail model bench`. Three settings, each after dropping the page cache, in a fresh
# memory cgroup:
#   default                 llama-bench as shipped: mmap, weight repacking on (--repack 1)
#   no-repack               --repack 0: Q4_0/Q4_K/IQ4_NL/MXFP4 weights are used in place from the
#                           mmap'ed file instead of being copied into interleaved layouts in
#                           anonymous memory (which the cgroup cannot evict without swap)
#   no-repack-ra128         as no-repack, with the disk's readahead cut to 128 KB
#
#   benches/llama_cpp.sh MODEL.gguf [--mem-gib 3 | --mem-mib N] [--tokens 8] [--threads 2]
#                        [--prompt 8] [--reps 1] [--settings default,no-repack,no-repack-ra128] [--json]
#
# Needs root (drop_caches, cgroups, readahead) and llama-bench from benches/llama_cpp_build.sh
# (LLAMA_CPP_DIR, default target/llama.cpp; or LLAMA_BENCH=/path/to/llama-bench).
# Each setting runs `llama-bench -m MODEL -p 0 -d PROMPT -n TOKENS -r REPS --no-warmup -t THREADS
# --repack 0|1 -o json --progress`: a PROMPT-token context is processed first (untimed), then
# TOKENS tokens are decoded one at a time and timed; s/token = median over the REPS runs of
# llama-bench's own time for them / TOKENS. No warmup run: the first decode pays for what the
# prompt did not bring in.
# llama-bench feeds random token ids (no sampling, no tokenizer needed), so it also runs on
# `tokenizer.ggml.model = no_vocab` files. Disk bytes/token: bytes llama-bench itself read+wrote on
# the model's disk during the timed decode, from a blkio cgroup (which only counts when it has a
# throttle rule: a non-limiting 1 TiB/s one is set), / TOKENS; see benches/llama_cpp_measure.py.
# One line per setting, or one JSON object per line with --json.
# Restores readahead and removes the cgroups on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

MODEL=""
MEM_BYTES=$((3 * 1024 * 1024 * 1024))
TOKENS=8
THREADS=2
PROMPT=8
REPS=1
SETTINGS=default,no-repack,no-repack-ra128
JSON=()
while (($#)); do
    case $1 in
        --mem-gib) MEM_BYTES=$(python3 -c "print(int(float('$2') * 2**30))"); shift 2 ;;
        --mem-mib) MEM_BYTES=$(python3 -c "print(int(float('$2') * 2**20))"); shift 2 ;;
        --tokens) TOKENS=$2; shift 2 ;;
        --threads) THREADS=$2; shift 2 ;;
        --prompt) PROMPT=$2; shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        --settings) SETTINGS=$2; shift 2 ;;
        --json) JSON=(--json); shift ;;
        -h|--help) usage ;;
        -*) echo "llama_cpp.sh: unknown option $1" >&2; usage ;;
        *) [[ -z $MODEL ]] || usage; MODEL=$1; shift ;;
    esac
done
[[ -n $MODEL && -f $MODEL ]] || { echo "llama_cpp.sh: model file '$MODEL' not found" >&2; usage; }
MODEL=$(realpath "$MODEL")
[[ $(id -u) == 0 ]] || { echo "llama_cpp.sh: needs root (drop_caches, cgroups, readahead)" >&2; exit 1; }

BENCH=${LLAMA_BENCH:-${LLAMA_CPP_DIR:-$ROOT/target/llama.cpp}/build/bin/llama-bench}
[[ -x $BENCH ]] || { echo "llama_cpp.sh: $BENCH missing: run benches/llama_cpp_build.sh" >&2; exit 1; }

CG_ROOT=/sys/fs/cgroup/memory
BLK_ROOT=/sys/fs/cgroup/blkio
[[ -f $CG_ROOT/memory.limit_in_bytes ]] || { echo "llama_cpp.sh: no cgroup v1 memory controller at $CG_ROOT" >&2; exit 1; }
[[ -f $BLK_ROOT/blkio.throttle.io_service_bytes ]] || { echo "llama_cpp.sh: no cgroup v1 blkio controller at $BLK_ROOT" >&2; exit 1; }

# The block device holding the model (a partition's readahead lives on its parent disk).
src=$(df --output=source "$MODEL" | tail -1)
DEV=$(lsblk -no PKNAME "$src" 2>/dev/null | head -1)
[[ -n $DEV ]] || DEV=$(basename "$src")
RA_FILE=/sys/block/$DEV/queue/read_ahead_kb
[[ -f $RA_FILE ]] || { echo "llama_cpp.sh: no $RA_FILE (model on $src)" >&2; exit 1; }
RA_ORIG=$(cat "$RA_FILE")
DEVNO=$(cat "/sys/block/$DEV/dev")

CG=$CG_ROOT/llama_cpp_bench.$$
BLK=$BLK_ROOT/llama_cpp_bench.$$
LOG=$(mktemp /tmp/llama_cpp_bench.XXXXXX.log)
remove_cg() {
    local root=$1 cg=$2
    [[ -d $cg ]] || return 0
    # Anything left in the group (an interrupted llama-bench) goes back to the root group first.
    while read -r pid; do echo "$pid" > "$root/cgroup.procs" 2>/dev/null || true; done < "$cg/cgroup.procs"
    rmdir "$cg" 2>/dev/null || { sleep 1; rmdir "$cg" 2>/dev/null; } || echo "llama_cpp.sh: could not remove $cg" >&2
}
cleanup() {
    echo "$RA_ORIG" > "$RA_FILE" || true
    remove_cg "$CG_ROOT" "$CG"
    remove_cg "$BLK_ROOT" "$BLK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "llama_cpp.sh: $(basename "$MODEL") ($(du -h "$MODEL" | cut -f1)), limit $((MEM_BYTES / 2**20)) MiB," \
     "$TOKENS tokens after a $PROMPT-token prompt, $THREADS threads, disk $DEV (readahead ${RA_ORIG} KB)," \
     "llama-bench log $LOG" >&2

run_setting() {
    local name=$1 repack=$2 ra=$3
    echo "$ra" > "$RA_FILE"
    remove_cg "$CG_ROOT" "$CG"
    remove_cg "$BLK_ROOT" "$BLK"
    mkdir "$CG" "$BLK"
    # Non-limiting throttle rules: without one, blkio.throttle.io_service_bytes stays at 0.
    echo "$DEVNO 1099511627776" > "$BLK/blkio.throttle.read_bps_device"
    echo "$DEVNO 1099511627776" > "$BLK/blkio.throttle.write_bps_device"
    # memory.memsw.* (memory+swap) exists here although there is no swap: pin it to the same limit
    # so that the figure stays RAM-only if swap (e.g. zram) is ever enabled. memsw must be >= limit,
    # so limit_in_bytes is written first.
    echo "$MEM_BYTES" > "$CG/memory.limit_in_bytes"
    [[ -f $CG/memory.memsw.limit_in_bytes ]] && echo "$MEM_BYTES" > "$CG/memory.memsw.limit_in_bytes"
    sync
    echo 3 > /proc/sys/vm/drop_caches
    echo "=== $name: repack=$repack readahead=${ra}KB" >> "$LOG"
    python3 "$ROOT/benches/llama_cpp_measure.py" --cgroup "$CG" --blkio "$BLK" --setting "$name" --disk "$DEV" \
        --tokens "$TOKENS" --reps "$REPS" --log "$LOG" "${JSON[@]}" -- \
        "$BENCH" -m "$MODEL" -p 0 -d "$PROMPT" -n "$TOKENS" -r "$REPS" --no-warmup -t "$THREADS" \
        --repack "$repack" -o json --progress || echo "llama_cpp.sh: $name failed, see $LOG" >&2
    remove_cg "$CG_ROOT" "$CG"
    remove_cg "$BLK_ROOT" "$BLK"
}

IFS=, read -ra want <<< "$SETTINGS"
for s in "${want[@]}"; do
    case $s in
        default) run_setting default 1 "$RA_ORIG" ;;
        no-repack) run_setting no-repack 0 "$RA_ORIG" ;;
        no-repack-ra128) run_setting no-repack-ra128 0 128 ;;
        *) echo "llama_cpp.sh: unknown setting $s" >&2; exit 2 ;;
    esac
done
