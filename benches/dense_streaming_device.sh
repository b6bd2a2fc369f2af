#!/usr/bin/env bash
# Issue 17's bench (benches/dense_streaming.sh: batch 1 against the I/O floor, batch 8 against
# batch 1 and the union bound, `model plan` against both, peak memory) on another machine, from a
# prebuilt release binary; no build, no llama.cpp, no verify passes.
#
#   NIGHTMAIL_BIN=PATH NIGHTMAIL_JSON=OUT benches/dense_streaming_device.sh [--small|--medium|--full] [REPEAT]
#
# REPEAT defaults to 3. Needs root: the page cache is dropped before each run and each runs in a
# memory cgroup (v2's memory.max / memory.peak / memory.events where /sys/fs/cgroup is the
# unified hierarchy, else v1's memory controller). NIGHTMAIL_THREADS sets the compute threads
# (default 2, as on the development machine). Prints the figures of dense_streaming.sh and writes
# one JSON object per run to OUT; the synthesized model (under target/bench) is deleted at the
# end unless KEEP_MODEL=1.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${NIGHTMAIL_BIN:?set NIGHTMAIL_BIN to a release build of nightmail}"
: "${NIGHTMAIL_JSON:?set NIGHTMAIL_JSON to the file for the JSON summary}"
[[ -x $NIGHTMAIL_BIN ]] || { echo "dense_streaming_device.sh: $NIGHTMAIL_BIN is not an executable" >&2; exit 1; }
SIZE=${1:---small}
REPEAT=${2:-3}
case $SIZE in
    --small) MODEL=$ROOT/target/bench/dense-heavy-small.gguf ;;
    --medium) MODEL=$ROOT/target/bench/dense-heavy-medium.gguf ;;
    --full) MODEL=$ROOT/target/bench/dense-heavy-full.gguf ;;
    *) sed -n '2,13p' "$0" >&2; exit 2 ;;
esac
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then cgroups=v2; else cgroups=v1; fi
echo "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2 / 2^20}' /proc/meminfo), cgroups $cgroups," \
    "$(df -h --output=avail "$ROOT" | tail -1 | tr -d ' ') free under $ROOT"
: > "$NIGHTMAIL_JSON"
NIGHTMAIL_BIN=$(realpath "$NIGHTMAIL_BIN") NIGHTMAIL_SUMMARY=$NIGHTMAIL_JSON \
    "$ROOT/benches/dense_streaming.sh" "$SIZE" --release --no-llama --no-verify --repeat "$REPEAT"
[[ ${KEEP_MODEL:-0} == 1 ]] || rm -f "$MODEL"
