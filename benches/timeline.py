#!/usr/bin/env python3
"""Where the disk idles during a decode: reads `model bench --timeline FILE` (one JSON span per
line, crates/nightmail-model/src/timeline.rs) and prints, over the timed steps, the time
with no read in flight and what the step was doing then, the busy time split by what was being
read, and per layer kind (streamed or resident dense weights) the step's phases.

    benches/timeline.py FILE [--skip N] [--rows K]

N: leading steps to leave out (default 1). K: only the steps of K rows (`model bench --verify
... --timeline FILE` records passes of every width, prefills between them; only the time inside
the chosen steps is counted).
"""
import json
import sys
from collections import defaultdict

BIN = 100  # microseconds


def main():
    path = sys.argv[1]
    skip = int(sys.argv[sys.argv.index("--skip") + 1]) if "--skip" in sys.argv else 1
    rows = int(sys.argv[sys.argv.index("--rows") + 1]) if "--rows" in sys.argv else None
    spans = [json.loads(l) for l in open(path) if l.strip()]
    steps = sorted((s for s in spans if s["what"] == "step" and (rows is None or s.get("rows", 1) == rows)),
                   key=lambda s: s["start_us"])[skip:]
    if not steps:
        sys.exit("no steps in the timeline")
    t0, t1 = steps[0]["start_us"], steps[-1]["end_us"]
    n = (t1 - t0) // BIN + 1
    # Only the bins inside a chosen step count (a verify bench runs other widths and prefills
    # between them).
    inside = [False] * n
    for s in steps:
        for i in range((s["start_us"] - t0) // BIN, min(n, (s["end_us"] - t0) // BIN)):
            inside[i] = True
    # Per bin: reads in flight of each kind, and the step's phase (innermost span wins).
    dense = [0] * n
    expert = [0] * n
    prefetch = [0] * n
    phase = ["between"] * n

    def bins(s):
        a, b = max(s["start_us"], t0), min(s["end_us"], t1)
        return range((a - t0) // BIN, (b - t0) // BIN) if b > a else range(0)

    for s in spans:
        w = s["what"]
        if w == "dense_io":
            for i in bins(s):
                dense[i] += 1
        elif w == "expert_io":
            for i in bins(s):
                expert[i] += 1
        elif w == "prefetch_io":
            for i in bins(s):
                prefetch[i] += 1
    # Outer phases first, inner ones over them.
    order = ["head", "roll_back", "attention", "route", "experts", "dense_wait", "expert_compute"]
    for w in order:
        for s in spans:
            if s["what"] == w:
                label = {"experts": "expert_wait"}.get(w, w)
                for i in bins(s):
                    phase[i] = label
    # Attention without the wait for its layer: attention compute.
    total = sum(inside) * BIN / 1e6
    idle = defaultdict(float)
    busy = defaultdict(float)
    for i in range(n):
        if not inside[i]:
            continue
        d, e, p = dense[i], expert[i], prefetch[i]
        if d + e + p == 0:
            idle[phase[i]] += BIN / 1e6
        else:
            kind = "+".join(k for k, v in (("dense", d), ("expert", e), ("prefetch", p)) if v)
            busy[kind] += BIN / 1e6
    nsteps = len(steps)
    print(f"{nsteps} steps, {total / nsteps:.3f} s/step")
    idle_s = sum(idle.values())
    print(f"disk idle {idle_s / nsteps:.3f} s/step ({idle_s / total:.0%}); while idle the step was in:")
    for k, v in sorted(idle.items(), key=lambda kv: -kv[1]):
        print(f"    {k:16s} {v / nsteps:.3f} s/step")
    print("disk busy, by what was in flight:")
    for k, v in sorted(busy.items(), key=lambda kv: -kv[1]):
        print(f"    {k:22s} {v / nsteps:.3f} s/step")
    # Bytes and rates.
    in_steps = lambda s: any(s["end_us"] > st["start_us"] and s["start_us"] < st["end_us"] for st in steps)
    for w in ("dense_io", "expert_io", "prefetch_io"):
        xs = [s for s in spans if s["what"] == w and in_steps(s)]
        if xs:
            b = sum(s["bytes"] for s in xs)
            dur = sum(s["end_us"] - s["start_us"] for s in xs) / 1e6
            print(f"{w:12s} {len(xs) / nsteps:6.1f} reads/step, {b / nsteps / 2**20:7.1f} MiB/step, "
                  f"{dur / len(xs) * 1e3:6.2f} ms each, {b / dur / 1e9 if dur else 0:.2f} GB/s per read")
    # The step's phases, summed per step.
    phases = defaultdict(float)
    for s in spans:
        if s["what"] in ("attention", "route", "experts", "dense_wait", "expert_compute", "head", "dense_build",
                         "roll_back") \
                and in_steps(s):
            phases[s["what"]] += (s["end_us"] - s["start_us"]) / 1e6
    print("step phases, s/step: " + ", ".join(f"{k} {v / nsteps:.3f}" for k, v in sorted(phases.items())))
    # Per layer: when its expert reads began after its routing ended (issue latency), how long
    # the block waited.
    route_end = {}
    for s in spans:
        if s["what"] == "route" and in_steps(s):
            route_end.setdefault(s["layer"], []).append(s["end_us"])
    lag = []
    for s in spans:
        if s["what"] == "expert_io" and in_steps(s):
            ends = [e for e in route_end.get(s["layer"], []) if e <= s["start_us"] + 50]
            if ends:
                lag.append(s["start_us"] - max(ends))
    if lag:
        lag.sort()
        print(f"expert read start after its routing: median {lag[len(lag) // 2] / 1e3:.2f} ms, "
              f"90% {lag[len(lag) * 9 // 10] / 1e3:.2f} ms")
    # Dense read-ahead: how far ahead of its use each streamed layer's read finished.
    waits = defaultdict(list)
    for s in spans:
        if s["what"] == "dense_wait" and in_steps(s):
            waits[s["layer"]].append((s["end_us"] - s["start_us"]) / 1e6)
    if waits:
        w = sum(sum(v) for v in waits.values())
        print(f"dense waits {w / nsteps:.3f} s/step over layers {sorted(waits)}")


if __name__ == "__main__":
    main()
