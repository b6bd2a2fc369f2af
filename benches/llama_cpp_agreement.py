#!/usr/bin/env python3
"""SmolLM2-135M-Instruct Q4_1: greedy continuations of 20 fixed chat prompts, nightmail vs
llama.cpp, on the same prompt token ids; the bar (issue 5) is the first 8 tokens identical for at
least 18 of the 20. Also reports how many prompts both tokenize identically.

    pip install numpy; CMAKE_ARGS=... pip install llama-cpp-python   (see common.py)
    cargo build -p nightmail && python3 benches/llama_cpp_agreement.py
"""

import sys

from common import llama_greedy, load_llama, model_path, nightmail_generate, nightmail_tokenize

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
    "What is 12 times 12?",
    "Explain photosynthesis in one sentence.",
    "Give me a synonym for happy.",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water in Celsius?",
    "Translate 'good morning' into Spanish.",
    "List the days of the week.",
    "What does a compiler do?",
    "Suggest a name for a pet cat.",
    "Why is the sky blue?",
    "What is the largest planet in our solar system?",
    "Write one sentence about autumn.",
    "How do I boil an egg?",
    "What is the square root of 81?",
    "Describe a bicycle in a few words.",
    "What language is spoken in Brazil?",
]
N = 8


def chat(question):
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def main():
    model = model_path()
    llm = load_llama(model, threads=2)
    agree = same_tokens = 0
    for q in QUESTIONS:
        text = chat(q)
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        ours_ids = nightmail_tokenize(model, text)
        same_tokens += ours_ids == ids
        theirs = llama_greedy(llm, ids, N)
        ours = nightmail_generate(model, ids, N)["tokens"][:N]
        ok = ours == theirs
        agree += ok
        mark = "ok  " if ok else "DIFF"
        print(f"{mark} {q!r}: nightmail {ours} llama.cpp {theirs}  {llm.detokenize(theirs).decode(errors='replace')!r}")
    print(f"first {N} greedy tokens identical: {agree}/{len(QUESTIONS)} (bar: 18)")
    print(f"prompt tokenization identical: {same_tokens}/{len(QUESTIONS)}")
    return 0 if agree >= 18 else 1


if __name__ == "__main__":
    sys.exit(main())
