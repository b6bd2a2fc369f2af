#!/usr/bin/env python3
"""benches/drafting.py's two jobs timed in CPU seconds instead of wall seconds, for two builds side
by side (run by run alternating): on a shared machine a run's wall time moves with the other jobs'
load, its CPU time on one thread much less. Each answer's decode CPU is its process's user + system
time less that of a one-token run of the same prompt (load and prefill). Modes as drafting.py's:
plain (`--draft none`), every guess lookup finds (`--draft-row-cost 0`, "all": deterministic
passes, so the cost of an extra row in one-row passes follows from the two), and the schedule
("lookup", which times its passes on the wall clock, so its choices still move with the load).
With `--load N`, N busy loops (`sh -c 'while :; do :; done'`, at the bench's own priority) run for
the whole bench and are killed at its end: the schedule's measured row cost then sees a machine
whose cores are shared, as a loaded server's are. `--jobs quote` runs only that job. Each
schedule run's row cost as it measured it (`pass_cost`) and the wall-clock decode times are
printed beside the CPU times.

    python3 benches/drafting_cpu.py --a PATH --b PATH [--repeat 3] [--threads 1] [--model PATH]
                                    [--load N] [--jobs summarize,quote]
"""
import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import model_path  # noqa: E402
from drafting import jobs  # noqa: E402

MODES = ("none", "all", "lookup")


def run(binary, model, prompt, mode, tokens, threads):
    cmd = [binary, "model", "generate", "--model", model, "--chat", "--prompt", prompt,
           "--max-new-tokens", str(tokens), "--greedy", "--json", "--draft", "none" if mode == "none" else "lookup"]
    if mode == "all":
        cmd += ["--draft-row-cost", "0"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=dict(os.environ, RAYON_NUM_THREADS=str(threads)))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(out.stdout)
    result["cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="one nightmail binary (e.g. main's release build)")
    ap.add_argument("--b", required=True, help="the other")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--model")
    ap.add_argument("--load", type=int, default=0, help="busy loops to run beside the bench")
    ap.add_argument("--jobs", default="summarize,quote")
    a = ap.parse_args()
    model = a.model or model_path()
    builds = {"a": a.a, "b": a.b}
    load = lambda: open("/proc/loadavg").read().split()[0]  # noqa: E731
    # Each loop in a session of its own, so that its shell and nothing else is killed at the end.
    busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True) for _ in range(a.load)]
    try:
        print(f"model {model}, {a.threads} thread(s), {a.repeat} runs per build and mode; {a.load} busy loops "
              f"(pids {[p.pid for p in busy]}); load {load()}")
        all_same = bench(a, model, builds, load)
    finally:
        for p in busy:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    sys.exit(0 if all_same else 1)


def bench(a, model, builds, load):
    all_same = True
    for name, prompt in jobs():
        if name not in a.jobs.split(","):
            continue
        runs = {}
        for r in range(a.repeat):
            for b in ("a", "b") if r % 2 == 0 else ("b", "a"):
                runs.setdefault((b, "base"), []).append(run(builds[b], model, prompt, "none", 1, a.threads))
                for m in MODES:
                    runs.setdefault((b, m), []).append(run(builds[b], model, prompt, m, a.tokens, a.threads))
        print(f"{name}: load {load()}")
        reference = runs[("a", "none")][0]["tokens"]
        for b in ("a", "b"):
            base = statistics.median(x["cpu"] for x in runs[(b, "base")])
            plain = statistics.median(x["cpu"] for x in runs[(b, "none")]) - base
            per_pass = plain / runs[(b, "none")][0]["verify_steps"]
            for m in MODES:
                rs = runs[(b, m)]
                cpu = statistics.median(x["cpu"] for x in rs) - base
                same = all(x["tokens"] == reference for x in rs)
                all_same &= same
                per = ", ".join(f"{(x['verify_steps'] + x['accepted']) / x['verify_steps']:.2f}" for x in rs)
                row = ""
                if m == "all" and rs[0]["drafted"]:
                    extra = (cpu - rs[0]["verify_steps"] * per_pass) / rs[0]["drafted"]
                    row = f"  extra row {extra * 1e3:.1f} ms = {extra / per_pass:.2f} of a {per_pass * 1e3:.1f} ms pass"
                if m == "lookup":
                    costs = ", ".join(f"{x['pass_cost']['per_row_s'] / x['pass_cost']['base_s']:.2f}"
                                      if x.get("pass_cost") else "-" for x in rs)
                    row = f"  measured row cost {costs}"
                wall = statistics.median(x["decode_seconds"] for x in rs)
                plain_wall = statistics.median(x["decode_seconds"] for x in runs[(b, "none")])
                print(f"  {b} {m:<6} decode cpu {cpu:6.2f} s ({plain / cpu:.2f}x plain) wall {wall:5.2f} s "
                      f"({plain_wall / wall:.2f}x plain)  tokens/pass {per}  same {'yes' if same else 'NO'}{row}")
    return all_same


if __name__ == "__main__":
    main()
