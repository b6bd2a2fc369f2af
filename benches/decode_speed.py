#!/usr/bin/env python3
"""Decode speed on SmolLM2-135M-Instruct Q4_1, nightmail vs llama.cpp, same file and thread
count, in one run: tokens/s of each (after the prompt, greedy) and their ratio.

    cargo build -p nightmail && python3 benches/decode_speed.py [--threads N] [--tokens N]
"""

import argparse
import os
import time

from common import llama_greedy, load_llama, model_path, nightmail_generate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    model = model_path()
    prompt_text = "<|im_start|>user\nTell me a long story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"
    llm = load_llama(model, args.threads)
    prompt = llm.tokenize(prompt_text.encode(), add_bos=False, special=True)

    llama_greedy(llm, prompt, 4)  # warm up
    llm.reset()
    llm.eval(prompt)
    import numpy as np

    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    start = time.perf_counter()
    for _ in range(args.tokens - 1):
        llm.eval([tok])
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    theirs = (args.tokens - 1) / (time.perf_counter() - start)

    nightmail_generate(model, prompt, 4, args.threads)  # warm the page cache
    ours = nightmail_generate(model, prompt, args.tokens, args.threads)["decode_tokens_per_second"]
    print(f"threads {args.threads}, {args.tokens} tokens, {os.path.basename(model)}")
    print(f"nightmail  {ours:8.1f} tokens/s")
    print(f"llama.cpp  {theirs:8.1f} tokens/s")
    print(f"ratio      {ours / theirs:8.2f}")


if __name__ == "__main__":
    main()
