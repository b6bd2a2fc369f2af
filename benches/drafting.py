#!/usr/bin/env python3
"""Issue 18's drafting goal on SmolLM2-135M-Instruct (Q4_1) with real mail text: a "summarize
this forwarded transcript" job and a reply that must quote the question, each run greedily with
`--draft none`, `--draft lookup` (as many guesses per pass as the measured cost of a row and the
acceptance rate make worth it) and `--draft lookup --draft-row-cost 0` ("all": every guess lookup
finds, the schedule before it measured costs) in the same run (alternating, `--repeat` times).
Prints, per job: the tokens, the model passes after the prompt (`verify_steps`), tokens per pass
(1 + the accepted drafts per pass: the issue's "mean tokens accepted per verify step", goal >=
1.6; the first run's, then every run's at the end of the line), whether the text is identical to plain greedy, and the median decode wall time per answer
of each mode. With `--draft-model PATH`, also `--draft-model PATH` ("model": the schedule) and the
same with `--draft-row-cost 0` ("model-all": every guess the draft model makes), in the same
run; `benches/draft_model.py` makes one of SmolLM2's own first layers.

    python3 benches/drafting.py [--tokens 200] [--repeat 3] [--threads 2] [--draft-max N] [--model PATH]
                                [--draft-model PATH]

Needs a built `nightmail` binary (cargo build -p nightmail).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, model_path, nightmail_binary  # noqa: E402

HERE = os.path.join(ROOT, "benches", "drafting")


def jobs():
    transcript = open(os.path.join(HERE, "transcript.txt")).read()
    question = open(os.path.join(HERE, "question.txt")).read()
    return [
        ("summarize", f"Summarize this forwarded transcript for someone who missed the call. "
                      f"Name who does what, and when.\n\n{transcript}"),
        ("quote", f"Reply to this email. Start your reply by quoting the member's question word "
                  f"for word, then answer it.\n\n{question}"),
    ]


def generate(model, prompt, tokens, mode, threads, draft_max=None, draft_model=None):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    cmd = [nightmail_binary(), "model", "generate", "--model", model, "--chat", "--prompt", prompt,
           "--max-new-tokens", str(tokens), "--greedy", "--json"]
    if mode.startswith("model"):
        cmd += ["--draft-model", draft_model]
    else:
        cmd += ["--draft", "none" if mode == "none" else "lookup"]
    if mode.endswith("all"):
        cmd += ["--draft-row-cost", "0"]
    if draft_max and mode != "none":
        cmd += ["--draft-max", str(draft_max)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft-max", type=int, help="most tokens guessed per pass (the engine's default otherwise)")
    ap.add_argument("--model")
    ap.add_argument("--draft-model", help="also measure this draft model (benches/draft_model.py makes one)")
    a = ap.parse_args()
    model = a.model or model_path()
    print(f"model {model}, {a.threads} threads, up to {a.tokens} new tokens, {a.repeat} runs per mode")
    print(f"{'job':<10} {'mode':<9} {'prompt':>6} {'tokens':>6} {'passes':>6} {'tok/pass':>8} {'accepted':>8} "
          f"{'drafted':>7} {'same':>5} {'plain s':>8} {'mode s':>8} {'speedup':>7}  row cost  tok/pass of each run")
    all_ok = True
    modes = ("none", "lookup", "all") + (("model", "model-all") if a.draft_model else ())
    for name, prompt in jobs():
        runs = {m: [] for m in modes}
        for _ in range(a.repeat):
            for mode in modes:
                runs[mode].append(generate(model, prompt, a.tokens, mode, a.threads, a.draft_max, a.draft_model))
        plain = runs["none"][0]
        t_plain = statistics.median(r["decode_seconds"] for r in runs["none"])
        for mode in modes[1:]:
            look = runs[mode][0]
            same = all(r["text"] == plain["text"] and r["tokens"] == plain["tokens"] for r in runs["none"] + runs[mode])
            all_ok &= same
            passes = look["verify_steps"]
            per_pass = (passes + look["accepted"]) / passes if passes else 0.0
            t_look = statistics.median(r["decode_seconds"] for r in runs[mode])
            costs = [r["pass_cost"] for r in runs[mode] if r.get("pass_cost")]
            row = statistics.median(c["per_row_s"] / c["base_s"] for c in costs) if costs else float("nan")
            # The schedule prices passes by their measured time, so passes differ between runs:
            # every run's tokens per pass, not only the first's.
            each = "/".join(f"{(r['verify_steps'] + r['accepted']) / r['verify_steps']:.2f}"
                            for r in runs[mode] if r["verify_steps"])
            print(f"{name:<10} {mode:<9} {len(plain['prompt_tokens']):>6} {len(look['tokens']):>6} {passes:>6} "
                  f"{per_pass:>8.2f} {look['accepted']:>8} {look['drafted']:>7} {'yes' if same else 'NO':>5} "
                  f"{t_plain:>8.2f} {t_look:>8.2f} {t_plain / t_look:>6.2f}x  {row:>8.2f}  {each}")
        if os.environ.get("DRAFTING_SHOW"):
            print(plain["text"])
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
