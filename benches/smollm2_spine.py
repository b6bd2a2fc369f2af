#!/usr/bin/env python3
"""Issue 17's int8 spine on a real model: SmolLM2-135M-Instruct as F16 (its Q4_1 GGUF's weights
dequantized to F16: no F16 export of the original weights is available offline, so these are the
Q4_1 values, held exactly), then `model pack --dense q8_0` and `--dense q4_0` of that, each run
greedily on the same chat prompts. Prints, per prompt, how many of the F16 model's greedy tokens
each requantized model reproduces before it first differs, and the totals.

    python3 benches/smollm2_spine.py [--tokens 48] [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]

Needs the `gguf` pip package (llama.cpp's gguf-py) and a built `nightmail` binary.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a mail server does in two sentences.",
    "List three fruits that are red.",
    "How do I boil an egg?",
    "What is 12 times 7?",
]


def to_f16(src: str, dst: str) -> None:
    """`src` with every quantized tensor dequantized to F16, metadata unchanged."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for t in r.tensors:
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            data = np.array(t.data)
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
        else:
            data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float16)
            w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def greedy(nm: str, model: str, prompt: str, tokens: int) -> list:
    out = subprocess.run(
        [nm, "model", "generate", "--model", model, "--prompt", prompt, "--chat", "--greedy",
         "--max-new-tokens", str(tokens), "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["tokens"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = p.parse_args()
    nm = os.path.join(ROOT, "target/debug/nightmail")
    with tempfile.TemporaryDirectory() as d:
        f16 = os.path.join(d, "f16.gguf")
        to_f16(args.model, f16)
        models = {"f16": f16}
        for q in ("q8_0", "q4_0"):
            models[q] = os.path.join(d, f"{q}.gguf")
            pack = subprocess.run([nm, "model", "pack", f16, models[q], "--dense", q],
                                  check=True, capture_output=True, text=True)
            print(pack.stdout.strip().splitlines()[-1])
        sizes = {k: os.path.getsize(v) for k, v in models.items()}
        print("sizes: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sizes.items()))
        totals = {"q8_0": [0, 0, 0], "q4_0": [0, 0, 0]}
        for prompt in PROMPTS:
            want = greedy(nm, f16, prompt, args.tokens)
            line = f"{prompt[:40]:<42}"
            for q in ("q8_0", "q4_0"):
                got = greedy(nm, models[q], prompt, args.tokens)
                prefix = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
                totals[q][0] += prefix
                totals[q][1] += len(want)
                totals[q][2] += int(got == want)
                line += f"  {q}: {prefix:>3}/{len(want)}"
            print(line)
        for q, (same, n, whole) in totals.items():
            print(f"{q}: {same}/{n} greedy tokens before the first difference ({100 * same / n:.0f}%), "
                  f"{whole}/{len(PROMPTS)} answers identical")


if __name__ == "__main__":
    sys.exit(main())
