#!/usr/bin/env bash
# A long prompt's prefill with the model larger than the memory it may use: nightmail
# (`model bench --prefill N --prefill-streamed-only`, passes sized by its budget, experts read
# with O_DIRECT) against llama.cpp (llama-cpp-python: `Llama(model, n_ctx, n_batch=2048,
# n_ubatch=2048, use_mmap=True)`, `eval` of the same N seeded tokens timed), each in a fresh
# cgroup v1 memory limit of MEM MiB below the model's size, the page cache dropped before each
# run, alternating, ROUNDS times. Prints one line per run and the ratio llama.cpp / nightmail.
#
#   benches/prefill_llama_cpp.sh [--tokens 512] [--mem-mib 320] [--budget-mb MEM-64]
#                                [--rounds 2] [--threads 2] [--model PATH] [--repack]
#                                [--read-mbps N] [--experts 256] [--expert-ffn 256]
#                                [--context 4096]
#
# --read-mbps also throttles each run's reads of the model's disk to N MB/s (a cgroup v1 blkio
# group): a disk slower than the compute, so that the comparison is disk-bound. --tokens above
# 2,048 is a prompt longer than llama.cpp's batch: it runs ceil(N / 2048) batches, each reading
# the model again, where nightmail's passes are as wide as its memory allows (up to the model's
# trained context: --context sets the written model's, which caps a pass). --experts sets the
# written model's experts per layer and --expert-ffn their width (a larger bank for a larger
# memory limit; llama.cpp takes at most 1,024 experts).
#
# The model (written if missing: `model synth` qwen3_moe, which llama.cpp reads as qwen3moe,
# with the demo model's tokenizer) has 8 layers of 256 Q4_0 experts (top 8) beside 112 MiB of
# dense weights: about 550 MiB (1,024 experts: about 1.8 GiB). llama.cpp runs with its weight repacking off
# (`use_extra_bufts = false`, llama-bench's --repack 0): repacked Q4_0 experts are copied into
# anonymous memory, which a limit below the model's size cannot evict (--repack keeps it on).
# nightmail's budget leaves 64 MiB of the limit to its binary and heap. Needs root (drop_caches,
# cgroups) and PYTHON with llama_cpp (default target/test-venv/bin/python3). NM names the nightmail
# binary to run (default target/debug/nightmail, built if missing): a baseline's build, say.
# Exits 0 whatever the figures are.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOKENS=512
MEM_MIB=320
BUDGET_MB=""
ROUNDS=2
THREADS=2
REPACK=0
READ_MBPS=""
EXPERTS=256
CONTEXT=4096
FFN=256
MODEL=""
PYTHON=${PYTHON:-$ROOT/target/test-venv/bin/python3}
while (($#)); do
    case $1 in
        --tokens) TOKENS=$2; shift 2 ;;
        --mem-mib) MEM_MIB=$2; shift 2 ;;
        --budget-mb) BUDGET_MB=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --threads) THREADS=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        --repack) REPACK=1; shift ;;
        --read-mbps) READ_MBPS=$2; shift 2 ;;
        --experts) EXPERTS=$2; shift 2 ;;
        --context) CONTEXT=$2; shift 2 ;;
        --expert-ffn) FFN=$2; shift 2 ;;
        *) sed -n '2,30p' "$0" >&2; exit 2 ;;
    esac
done
BUDGET_MB=${BUDGET_MB:-$((MEM_MIB - 64))}
if [[ -z $MODEL ]]; then
    MODEL=$ROOT/target/bench/prefill-llama-cpp.gguf
    ((EXPERTS == 256)) || MODEL=$ROOT/target/bench/prefill-llama-cpp-$EXPERTS.gguf
    ((FFN == 256)) || MODEL=${MODEL%.gguf}-ffn$FFN.gguf
    ((CONTEXT == 4096)) || MODEL=${MODEL%.gguf}-ctx$CONTEXT.gguf
fi
[[ $(id -u) == 0 ]] || { echo "prefill_llama_cpp.sh: needs root (drop_caches, cgroups)" >&2; exit 1; }
CG_ROOT=/sys/fs/cgroup/memory
[[ -f $CG_ROOT/memory.limit_in_bytes ]] || { echo "prefill_llama_cpp.sh: no cgroup v1 memory controller" >&2; exit 1; }
cd "$ROOT"
NM=${NM:-$ROOT/target/debug/nightmail}
[[ -x $NM ]] || cargo build --bin nightmail
if [[ ! -f $MODEL ]]; then
    mkdir -p "$(dirname "$MODEL")"
    DEMO=$(bash scripts/fetch-model.sh | tail -1)
    "$NM" model synth --layers 8 --experts "$EXPERTS" --top-k 8 --hidden 512 --expert-ffn "$FFN" --heads 4 \
        --kv-heads 2 --context-length "$CONTEXT" --tokenizer-from "$DEMO" --out "$MODEL" >&2
fi
MODEL_MIB=$(($(stat -c %s "$MODEL") >> 20))
((MEM_MIB < MODEL_MIB)) || echo "prefill_llama_cpp.sh: $MEM_MIB MiB holds the $MODEL_MIB MiB model: nothing streams" >&2

CG=$CG_ROOT/nightmail-prefill-$$
BLK_ROOT=/sys/fs/cgroup/blkio
BLK=$BLK_ROOT/nightmail-prefill-$$
cleanup() {
    if [[ -d $CG ]]; then
        while read -r pid; do echo "$pid" > "$CG_ROOT/cgroup.procs" 2>/dev/null || true; done < "$CG/cgroup.procs"
        rmdir "$CG" 2>/dev/null || true
    fi
}
trap 'cleanup; [[ -d $BLK ]] && rmdir "$BLK"' EXIT
if [[ -n $READ_MBPS ]]; then
    mkdir "$BLK"
    echo "$(findmnt -no MAJ:MIN -T "$MODEL" | tr -d ' ') $((READ_MBPS * 1000000))" > "$BLK/blkio.throttle.read_bps_device"
fi
# Runs "$@" in a fresh memory cgroup of MEM_MIB after dropping the page cache; prints its stdout.
limited() {
    cleanup
    mkdir "$CG"
    echo $((MEM_MIB << 20)) > "$CG/memory.limit_in_bytes"
    [[ -f $CG/memory.memsw.limit_in_bytes ]] && echo $((MEM_MIB << 20)) > "$CG/memory.memsw.limit_in_bytes"
    sync
    echo 3 > /proc/sys/vm/drop_caches
    bash -c 'echo $$ > "$1/cgroup.procs"; [[ -d $2 ]] && echo $$ > "$2/cgroup.procs"; shift 2; exec "$@"' \
        _ "$CG" "$BLK" "$@"
}

LLAMA=$(cat <<'PY'
import json, os, random, sys, time
import llama_cpp
import llama_cpp.llama_cpp as low
model, tokens, threads, repack = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
default = low.llama_model_default_params
def params():
    p = default()
    p.use_extra_bufts = repack
    return p
low.llama_model_default_params = params
t0 = time.perf_counter()
llm = llama_cpp.Llama(model_path=model, n_ctx=tokens + 16, n_batch=2048, n_ubatch=2048, use_mmap=True,
                      n_threads=threads, n_threads_batch=threads, verbose=False)
load_s = time.perf_counter() - t0
rng = random.Random(0x2545F491)
vocab = llm.n_vocab()
prompt = [rng.randrange(vocab) for _ in range(tokens)]
t0 = time.perf_counter()
llm.eval(prompt)
print(json.dumps({"prefill_s": time.perf_counter() - t0, "load_s": load_s, "tokens": tokens}))
PY
)

lines=""
for ((r = 1; r <= ROUNDS; r++)); do
    nm=$(RAYON_NUM_THREADS=$THREADS limited "$NM" model bench --model "$MODEL" --memory-mb "$BUDGET_MB" \
        --kv-tokens $((TOKENS + 16)) --prefill "$TOKENS" --prefill-streamed-only --probe-mb 64 --json \
        2>/tmp/prefill_llama_cpp.$$.err) || { cat /tmp/prefill_llama_cpp.$$.err >&2; exit 1; }
    lines+="nightmail $nm $(($(cat "$CG/memory.max_usage_in_bytes") >> 20))"$'\n'
    lc=$(limited "$PYTHON" -c "$LLAMA" "$MODEL" "$TOKENS" "$THREADS" "$REPACK" 2>/tmp/prefill_llama_cpp.$$.err) \
        || { tail -5 /tmp/prefill_llama_cpp.$$.err >&2; exit 1; }
    lines+="llama.cpp $lc $(($(cat "$CG/memory.max_usage_in_bytes") >> 20))"$'\n'
done
rm -f /tmp/prefill_llama_cpp.$$.err
LINES="$lines" READ_MBPS=${READ_MBPS:+$READ_MBPS MB/s} MEM_MIB=$MEM_MIB MODEL_MIB=$MODEL_MIB BUDGET_MB=$BUDGET_MB python3 - <<'PY'
import json, os
nm, lc = [], []
for line in os.environ["LINES"].splitlines():
    who, _, rest = line.partition(" ")
    body, _, peak = rest.rpartition(" ")
    run = json.loads(body)
    run["peak_mib"] = int(peak)
    (nm if who == "nightmail" else lc).append(run)
print(f"model {os.environ['MODEL_MIB']} MiB, memory limit {os.environ['MEM_MIB']} MiB "
      f"(nightmail budget {os.environ['BUDGET_MB']} MiB), reads {os.environ['READ_MBPS'] or 'unthrottled'}")
for a, b in zip(nm, lc):
    print(f"nightmail {a['prefill_s']:.2f} s ({a['prefill_passes']} passes of {a['prefill_chunk']}, "
          f"expert bank read {a['expert_bank_reads']:.1f} times, I/O floor {a['prefill_io_floor_s']:.2f} s, "
          f"RSS peak {a['rss_peak_bytes'] >> 20} MiB, cgroup peak {a['peak_mib']} MiB); llama.cpp {b['prefill_s']:.2f} s (load {b['load_s']:.2f} s, "
          f"cgroup peak {b['peak_mib']} MiB): llama.cpp / nightmail = "
          f"{b['prefill_s'] / a['prefill_s']:.2f}x")
PY
