#!/usr/bin/env python3
"""Decode speed on SmolLM2-135M-Instruct Q4_1, nightmail vs llama.cpp, same file and thread
count, in one run: tokens/s of each (greedy, after the prompt; best of --repeat runs, taken in
turns so that load from other processes hits both alike) and their ratio.

    cargo build -p nightmail && python3 benches/decode_speed.py [--threads N] [--tokens N] [--repeat N]
"""

import argparse
import os
import time

import numpy as np

from common import last_logits, llama_greedy, load_llama, model_path, nightmail_generate


def llama_tokens_per_second(llm, prompt, tokens):
    llm.reset()
    llm.eval(prompt)
    tok = int(np.argmax(last_logits(llm)))
    start = time.perf_counter()
    for _ in range(tokens - 1):
        llm.eval([tok])
        tok = int(np.argmax(last_logits(llm)))
    return (tokens - 1) / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    model = model_path()
    prompt_text = "<|im_start|>user\nTell me a long story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"
    llm = load_llama(model, args.threads)
    prompt = llm.tokenize(prompt_text.encode(), add_bos=False, special=True)
    llama_greedy(llm, prompt, 4)  # warm up
    nightmail_generate(model, prompt, 4, args.threads)
    ours, theirs = [], []
    for _ in range(args.repeat):
        theirs.append(llama_tokens_per_second(llm, prompt, args.tokens))
        ours.append(nightmail_generate(model, prompt, args.tokens, args.threads)["decode_tokens_per_second"])
    print(f"threads {args.threads}, {args.tokens} tokens, best of {args.repeat}, {os.path.basename(model)}")
    print(f"nightmail  {max(ours):8.1f} tokens/s   (runs: {', '.join(f'{x:.1f}' for x in ours)})")
    print(f"llama.cpp  {max(theirs):8.1f} tokens/s   (runs: {', '.join(f'{x:.1f}' for x in theirs)})")
    print(f"ratio      {max(ours) / max(theirs):8.2f}")


if __name__ == "__main__":
    main()
