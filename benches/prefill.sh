#!/usr/bin/env bash
# A long prompt prefilled with the experts streamed: passes as wide as the memory budget allows
# against the old fixed 32-token passes, each against its I/O floor (bytes read over the disk rate
# measured in the same run) and the same prefill with the model in RAM. Configurations alternate,
# ROUNDS times, so machine load falls on both alike.
#
#   benches/prefill.sh [--tokens 1024] [--memory-mb 256] [--rounds 2] [--model PATH]
#                      [--read-mbps N] [--synth "model synth options"]
#
# --read-mbps runs each bench in a cgroup v1 blkio group whose reads of the model's disk are
# throttled to N MB/s, after dropping the page cache (root): a disk slower than the compute, as a
# fast CPU beside an SSD has it, so the measurement is disk-bound on a slow shared machine too.
#
# The model (written if missing) has many small experts and small dense weights, so its experts
# dominate: 8 layers of 256 Q4_0 experts (top 8, 216 KiB each, 432 MiB) beside 24 MiB dense.
# Prints one line per run and the ratios; exits 0 whatever they are.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOKENS=1024
MEMORY_MB=256
ROUNDS=2
MODEL=$ROOT/target/bench/prefill-many-small.gguf
READ_MBPS=""
SYNTH="--layers 8 --experts 256 --top-k 8 --hidden 512 --expert-ffn 256 --heads 4 --kv-heads 2 --vocab 4096"
while (($#)); do
    case $1 in
        --tokens) TOKENS=$2; shift 2 ;;
        --memory-mb) MEMORY_MB=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        --read-mbps) READ_MBPS=$2; shift 2 ;;
        --synth) SYNTH=$2; shift 2 ;;
        *) sed -n '2,17p' "$0" >&2; exit 2 ;;
    esac
done
cd "$ROOT"
NM=$ROOT/target/debug/nightmail
[[ -x $NM ]] || cargo build --bin nightmail
if [[ ! -f $MODEL ]]; then
    mkdir -p "$(dirname "$MODEL")"
    # shellcheck disable=SC2086 # the options are words
    "$NM" model synth $SYNTH --out "$MODEL" >&2
fi
RUN=()
if [[ -n $READ_MBPS ]]; then
    BLK=/sys/fs/cgroup/blkio/nightmail-prefill-$$
    DEV=$(findmnt -no MAJ:MIN -T "$MODEL" | tr -d ' ')
    mkdir "$BLK"
    trap 'cat "$BLK/cgroup.procs" | while read -r p; do echo "$p" > /sys/fs/cgroup/blkio/cgroup.procs; done; rmdir "$BLK"' EXIT
    echo "$DEV $((READ_MBPS * 1000000))" > "$BLK/blkio.throttle.read_bps_device"
    RUN=(bash -c 'sync; echo 3 > /proc/sys/vm/drop_caches; echo $$ > "$0/cgroup.procs"; exec "$@"' "$BLK")
fi
runs=""
for ((r = 1; r <= ROUNDS; r++)); do
    for chunk in "" 32; do
        out=$("${RUN[@]}" "$NM" model bench --model "$MODEL" --memory-mb "$MEMORY_MB" --prefill "$TOKENS" \
            --probe-mb 256 ${chunk:+--prefill-chunk "$chunk"} --json 2>/dev/null)
        runs+="$out"$'\n'
    done
done
RUNS="$runs" python3 - <<'PY'
import json, os
runs = [json.loads(l) for l in os.environ["RUNS"].splitlines() if l.strip()]
for r in runs:
    print(f"passes of {r['prefill_chunk']:>4}: {r['prefill_s']:.3f} s, I/O floor {r['prefill_io_floor_s']:.3f} s, "
          f"resident {r['prefill_resident_s']:.3f} s, / max = {r['ratio_to_bound']:.2f} (goal <= 1.3), "
          f"expert bank read {r['expert_bank_reads']:.1f} times, disk {r['disk_gbps']:.2f} GB/s, "
          f"RSS peak {r['rss_peak_bytes'] >> 20} MiB")
sized = [r for r in runs if r["prefill_chunk"] != 32]
fixed = [r for r in runs if r["prefill_chunk"] == 32]
for a, b in zip(sized, fixed):
    print(f"round: fixed 32 / sized = {b['prefill_s'] / a['prefill_s']:.2f}x (goal >= 3), "
          f"bytes read {b['prefill_disk_bytes'] / a['prefill_disk_bytes']:.2f}x fewer")
PY
