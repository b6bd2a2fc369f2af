#!/usr/bin/env python3
"""Replays benches/drafting.py's two jobs offline: greedy acceptance is deterministic (a guess
holds exactly when it equals plain greedy's token in its place), so one plain run's prompt and
answer tokens replay prompt lookup and any schedule of guesses at a fixed row cost (the cost of an
extra verify row in one-row passes), without running the model again.

Prints, per job: (1) how often a guess holds given that the guesses before it in the same pass
held, by the length of the match it was copied from and its place in the pass; (2) how often the
first guess holds after a first guess that held (a copy streak) or not; (3) tokens per pass and
the speed-up over plain decoding (passes + row cost x rows, against one pass per token) of:
"every" (every guess lookup finds, up to 8), "oracle" (exactly the guesses that hold),
"one rate" (the schedule before 2026-12-04 evening: `best_draft_len` at one running rate over
guesses run or not), "copy length" (the schedule before 2026-12-05: at the rate first guesses
hold, and when that pays at least as many guesses as the match is long) and "match length"
(nightmail-engine/src/draft/schedule.rs `MatchAcceptance` now: a rate per class of match length, each guess at the
rate of its match length plus its place, the best length of that chain and at least the match's
length when any). The schedules follow nightmail-engine/src/generate.rs step for step (at a fixed row cost; a
measured one adds PassCosts' probes); `--draft-row-cost X` runs of the binary give the same
passes.

A second table prices each pass by its width as `--curve` gives it (one-row passes by rows, from
`model bench --verify`: on SmolLM2 the first extra rows are cheaper than the later ones), each
row's share scaled by 1 to 1.8 (a loaded machine), as PassCosts::guess_costs prices them; the
older rules see the line's mean row.

    python3 benches/drafting_replay.py [--tokens 200] [--model PATH] [--row-costs 0.25,0.46,0.55,0.65,0.8]
                                       [--curve 1:1,2:1.29,3:1.56,5:2.53,9:4.29]

Needs a built `nightmail` binary (NIGHTMAIL_BIN, else target/debug/nightmail).
"""
import argparse
import collections
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import model_path, nightmail_binary  # noqa: E402
from drafting import jobs  # noqa: E402

CAP, MIN, MAX_DRAFT, KEEP = 32, 2, 8, 0.85  # PromptLookup's defaults, Acceptance's decay
RULES = ("every", "oracle", "one rate", "copy length", "match length")


def longest_match(ctx):
    """nightmail-engine/src/draft/lookup.rs `longest_match`: (length, where the continuation starts) or None."""
    last, n, best = ctx[-1], len(ctx), None
    for end in range(n - 2, -1, -1):
        if ctx[end] != last:
            continue
        length = 1
        for back in range(1, min(end, CAP - 1) + 1):
            if ctx[end - back] != ctx[n - 1 - back]:
                break
            length += 1
        if best is None or length > best[0]:
            best = (length, end + 1)
            if length >= CAP:
                break
    return best if best and best[0] >= MIN else None


def best_draft_len(alpha, row_cost, most):
    value = lambda k: sum(alpha ** i for i in range(k + 1)) / (1 + row_cost * k)  # noqa: E731
    if most <= 0:
        return 0
    best = max(range(1, most + 1), key=lambda k: (value(k), -k))
    return best if value(best) > value(0) * 1.01 else 0


def best_chain_len(alphas, costs):
    """schedule.rs `best_chain_len`: a rate per place, costs[k] for a pass of k guesses."""
    tokens, held, best = 1.0, 1.0, None
    for i, (alpha, cost) in enumerate(zip(alphas, costs[1:])):
        held *= alpha
        tokens += held
        value = tokens / cost
        if best is None or value > best[1]:
            best = (i + 1, value)
    return best[0] if best and best[1] > 1.01 else 0


class Rate:
    """schedule.rs `Acceptance`."""

    def __init__(self, accepted=1.0, rejected=1.0):
        self.accepted, self.rejected = accepted, rejected

    def record(self, accepted, rejected):
        self.accepted = self.accepted * KEEP + accepted
        self.rejected = self.rejected * KEEP + (1 if rejected else 0)

    def rate(self):
        return self.accepted / (self.accepted + self.rejected)


MATCH_CLASSES = (2, 3, 4, 6, 12)  # schedule.rs: the shortest match of each class


class ByMatch:
    """schedule.rs `MatchAcceptance`: a rate per match-length class, from Laplace's prior."""

    def __init__(self):
        self.rates = [Rate(2 * (n + 1) / (n + 2), 2 / (n + 2)) for n in MATCH_CLASSES]

    def cls(self, matched):
        return max(i for i, n in enumerate(MATCH_CLASSES) if matched >= n or i == 0)

    def record(self, matched, held):
        self.rates[self.cls(matched)].record(int(held), not held)

    def rate(self, matched):
        return self.rates[self.cls(matched)].rate()

    def draft_len(self, matched, costs):
        room = len(costs) - 1
        k = best_chain_len([self.rate(matched + j) for j in range(room)], costs)
        return max(k, min(matched, room)) if k else 0


def curve_costs(curve, scale, room):
    """A pass of k guesses priced as `curve` (rows -> one-row passes, interpolated) prices it,
    each row's share scaled by `scale`: PassCosts::guess_costs on a machine that measures it."""
    points = sorted(curve.items())

    def at(rows):
        for (r0, c0), (r1, c1) in zip(points, points[1:]):
            if r0 <= rows <= r1:
                return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
        (r0, c0), (r1, c1) = points[-2], points[-1]
        return c1 + (c1 - c0) * (rows - r1) / (r1 - r0)
    return [1 + (at(k + 1) - 1) * scale for k in range(room + 1)]


def replay(prompt, answer, row_cost, rule, budget, curve=None, scale=1.0):
    """nightmail-engine/src/draft/verify.rs `Verifier::plan_feed` over the plain answer: (passes, rows, accepted, cost in one-row
    passes). Each extra row costs `row_cost`, or with `curve` a pass is priced per width."""
    rate, first_rate, by_match = Rate(), Rate(), ByMatch()
    shadow, ahead, run_accepted, first = [], [], 0, None
    ahead_matched, first_matched = 0, 0
    passes = rows = accepted = 0
    cost = 0.0
    i = 0
    while i < len(answer):
        tok = answer[i]
        if first is not None:
            first_rate.record(int(first == tok), first != tok)
            if rule == "match length":
                by_match.record(first_matched, first == tok)
            first = None
        if shadow:
            if shadow.pop(0) == tok:
                run_accepted += 1
                if not shadow:
                    rate.record(run_accepted, False)
                    run_accepted = 0
            else:
                shadow = []
                rate.record(run_accepted, True)
                run_accepted = 0
        if ahead:
            if rule == "match length":
                by_match.record(ahead_matched, ahead[0] == tok)
                ahead_matched += 1
            if ahead.pop(0) == tok:
                accepted += 1
                run_accepted += 1
                if not ahead:
                    rate.record(run_accepted, False)
                    run_accepted = 0
                i += 1
                continue
            ahead = []
            rate.record(run_accepted, True)
            run_accepted = 0
        if i == len(answer) - 1:
            break
        history = prompt + answer[: i + 1]
        room = max(0, min(budget - (i + 2), MAX_DRAFT))
        costs = curve_costs(curve, scale, room) if curve else [1 + row_cost * k for k in range(room + 1)]
        match = longest_match(history)
        guesses = history[match[1]:match[1] + room] if match else []
        if rule == "every":
            k = room
        elif rule == "oracle":
            k = next((j for j, g in enumerate(guesses) if i + 1 + j >= len(answer) or g != answer[i + 1 + j]), len(guesses))
        elif rule == "one rate":
            k = best_draft_len(rate.rate(), row_cost, room)
        elif rule == "match length":
            matched = match[0] if match else 0
            k = by_match.draft_len(matched, costs) if match else 0
            if k == 0 and guesses:
                first, first_matched = guesses[0], matched
            ahead_matched = matched
        else:
            first = guesses[0] if guesses else None
            k = best_draft_len(first_rate.rate(), row_cost, room)
            if k:
                k = max(k, min(match[0] if match else 0, room))
        if k == 0 and rule == "one rate" and not shadow:
            shadow = list(guesses)
        elif k and shadow:
            shadow = []
            rate.record(run_accepted, False)
            run_accepted = 0
        fed = guesses[:k]
        passes += 1
        rows += len(fed)
        cost += costs[len(fed)]
        ahead = list(fed)
        i += 1
    return passes, rows, accepted, cost


def tables(prompt, answer):
    """Per guess: held given those before it held, by (match length bucket, place); first
    guesses by whether the last first guess held."""
    def bucket(n):
        return "2" if n == 2 else "3" if n == 3 else "4-5" if n <= 5 else "6-11" if n <= 11 else "12+"
    by_place = collections.defaultdict(lambda: [0, 0])
    streak = collections.defaultdict(lambda: [0, 0])
    last_held = False
    for i in range(len(answer) - 1):
        history = prompt + answer[: i + 1]
        match = longest_match(history)
        if not match:
            last_held = False
            continue
        guesses = history[match[1]:match[1] + MAX_DRAFT]
        for j, g in enumerate(guesses):
            if i + 1 + j >= len(answer):
                break
            held = g == answer[i + 1 + j]
            cell = by_place[(bucket(match[0]), min(j + 1, 4))]
            cell[0] += held
            cell[1] += 1
            if j == 0:
                streak[last_held][0] += held
                streak[last_held][1] += 1
                last_held = held
            if not held:
                break
    return by_place, streak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--model")
    ap.add_argument("--row-costs", default="0.25,0.46,0.55,0.65,0.8")
    # `model bench --verify 1,2,3,5,9 --tokens 30` on SmolLM2, one thread, 2026-12-04 23:23 UTC.
    ap.add_argument("--curve", default="1:1,2:1.29,3:1.56,5:2.53,9:4.29",
                    help="a pass's cost by its rows, in one-row passes (rows:cost,...)")
    a = ap.parse_args()
    model = a.model or model_path()
    costs = [float(c) for c in a.row_costs.split(",")]
    curve = {int(r): float(c) for r, c in (p.split(":") for p in a.curve.split(","))}
    for name, text in jobs():
        cmd = [nightmail_binary(), "model", "generate", "--model", model, "--chat", "--prompt", text,
               "--max-new-tokens", str(a.tokens), "--greedy", "--json", "--draft", "none"]
        plain = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        prompt, answer = plain["prompt_tokens"], plain["tokens"]
        print(f"== {name}: {len(prompt)} prompt tokens, {len(answer)} answer tokens")
        by_place, streak = tables(prompt, answer)
        print("  guess holds | the ones before it held, by match length (rows) and place (columns):")
        print("  match  " + "".join(f"{p:<15}" for p in ("1st", "2nd", "3rd", "4th-8th")))
        for b in ("2", "3", "4-5", "6-11", "12+"):
            cells = []
            for p in range(1, 5):
                held, judged = by_place[(b, p)]
                cells.append(f"{held / judged:.2f} ({held}/{judged})" if judged else "-")
            print(f"  {b:<6} " + "".join(f"{c:<15}" for c in cells))
        for s in (False, True):
            held, judged = streak[s]
            if judged:
                print(f"  first guess after a first guess that {'held' if s else 'failed (or none)'}: "
                      f"{held / judged:.2f} ({held}/{judged})")
        print(f"  {'row cost':>8} " + "".join(f"{r:<22}" for r in RULES))
        for cost in costs:
            cells = []
            for rule in RULES:
                passes, rows, accepted, spent = replay(prompt, answer, cost, rule, a.tokens)
                cells.append(f"{(passes + accepted) / passes:.2f} tok/pass {(len(answer) - 1) / spent:.2f}x")
            print(f"  {cost:>8.2f} " + "".join(f"{c:<22}" for c in cells))
        print(f"  passes priced per width ({a.curve} one-row passes at rows:cost, each row's share scaled):")
        print(f"  {'scale':>8} {'mean row':>8} " + "".join(f"{r:<22}" for r in RULES))
        for scale in (1.0, 1.2, 1.4, 1.6, 1.8):
            mean_row = (curve_costs(curve, scale, MAX_DRAFT)[-1] - 1) / MAX_DRAFT
            cells = []
            for rule in RULES:
                passes, rows, accepted, spent = replay(prompt, answer, mean_row, rule, a.tokens, curve, scale)
                cells.append(f"{(passes + accepted) / passes:.2f} tok/pass {(len(answer) - 1) / spent:.2f}x")
            print(f"  {scale:>8.1f} {mean_row:>8.2f} " + "".join(f"{c:<22}" for c in cells))


if __name__ == "__main__":
    main()
