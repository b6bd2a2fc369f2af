#!/usr/bin/env bash
# Engine II's goals in one run: nightmail streaming the reference model against the I/O floor it
# measures itself, and against llama.cpp (built from the llama-cpp-python sdist) on the same file,
# both in a memory cgroup of the same size, 2 threads.
#
#   benches/streaming.sh [--mem-gib 3] [--cache-mb 1536] [--tokens 16] [--model PATH]
#
# The reference model is benches/reference_model.sh's (written if missing). Needs root
# (drop_caches, cgroups, readahead). Prints each figure and the ratios; exits 0 whatever they are.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MEM_GIB=3
CACHE_MB=1536
TOKENS=16
MODEL=${MODEL:-$ROOT/target/bench/qwen3moe-30b-a3b-shape.q4_0.gguf}
while (($#)); do
    case $1 in
        --mem-gib) MEM_GIB=$2; shift 2 ;;
        --cache-mb) CACHE_MB=$2; shift 2 ;;
        --tokens) TOKENS=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        *) sed -n '2,12p' "$0" >&2; exit 2 ;;
    esac
done
[[ $(id -u) == 0 ]] || { echo "streaming.sh: needs root (drop_caches, cgroups)" >&2; exit 1; }

cd "$ROOT"
MODEL=$(benches/reference_model.sh "$MODEL")
NM=$ROOT/target/debug/nightmail
benches/llama_cpp_build.sh >/dev/null

cg=/sys/fs/cgroup/memory/nightmail-bench-$$
cleanup() { [[ -d $cg ]] && rmdir "$cg" 2>/dev/null || true; }
trap cleanup EXIT
mkdir "$cg"
echo $((MEM_GIB * 1024 * 1024 * 1024)) > "$cg/memory.limit_in_bytes"
sync; echo 3 > /proc/sys/vm/drop_caches
ours=$(sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$NM" model bench --model "$MODEL" \
    --cache-mb "$CACHE_MB" --tokens "$TOKENS" --json)
oom=$(awk '/oom_kill /{print $2}' "$cg/memory.oom_control")
rmdir "$cg"
theirs=$(benches/llama_cpp.sh "$MODEL" --mem-gib "$MEM_GIB" --tokens "$TOKENS" --threads 2 --json)

OURS="$ours" THEIRS="$theirs" OOM="$oom" python3 - <<'PY'
import json, os
ours = json.loads(os.environ["OURS"])
theirs = [json.loads(l) for l in os.environ["THEIRS"].splitlines() if l.strip().startswith("{")]
g = lambda b: b / 2**20
print(f"nightmail   {ours['s_per_token']:.3f} s/token, {g(ours['disk_bytes_per_token']):.0f} MiB/token from disk "
      f"(experts needed {g(ours['expert_bytes_per_token']):.0f} MiB), hit rate {ours['hit_rate']:.1%}, "
      f"prefetch recall {ours['prefetch_recall']:.1%}, RSS peak {ours['rss_peak_bytes'] / 2**30:.2f} GiB, "
      f"OOM kills {os.environ['OOM']}")
print(f"disk        {ours['disk_gbps']:.2f} GB/s sequential O_DIRECT; I/O floor {ours['floor_s_per_token']:.3f} s/token")
print(f"ratio       measured / floor = {ours['ratio_to_floor']:.2f}  (goal <= 1.25)")
print(f"amplif.     disk bytes / bytes of uncached experts = {ours['read_amplification']:.3f}  (goal <= 1.10)")
best = None
for t in theirs:
    s = t.get("s_per_token")
    state = "OOM-killed" if t.get("oom_killed") else (f"{s:.3f} s/token" if s else "no result")
    dpt = t.get("disk_bytes_per_token")
    extra = f", {g(dpt):.0f} MiB/token from disk" if dpt else ""
    print(f"llama.cpp   {t['setting']:<16} {state}{extra}")
    if s and not t.get("oom_killed"):
        if best is None or s < best[1]:
            best = (t["setting"], s)
        if t["setting"] == "default":
            print(f"ratio       llama.cpp default / nightmail = {s / ours['s_per_token']:.2f}  (goal >= 5)")
if best:
    print(f"ratio       llama.cpp best ({best[0]}) / nightmail = {best[1] / ours['s_per_token']:.2f}  (goal >= 1.5)")
PY
