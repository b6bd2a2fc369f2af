"""Shared helpers for the llama.cpp comparisons: find the demo model and the nightmail binary,
and load llama.cpp (llama-cpp-python) on the same file."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# llama-cpp-python must be built for a CPU like the ones we compare on, not for the build host:
LLAMA_CPP_BUILD = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF '
    '-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF" pip install llama-cpp-python'
)


def model_path():
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts/fetch-model.sh")], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def nightmail_binary():
    path = os.environ.get("NIGHTMAIL_BIN")
    if path:
        return path
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "debug", "nightmail")


def nightmail_generate(model, tokens, max_new_tokens, threads=None):
    env = dict(os.environ)
    if threads:
        env["RAYON_NUM_THREADS"] = str(threads)
    cmd = [nightmail_binary(), "model", "generate", "--model", model, "--prompt-tokens", ",".join(map(str, tokens)),
           "--max-new-tokens", str(max_new_tokens), "--greedy", "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout)


def nightmail_tokenize(model, text):
    cmd = [nightmail_binary(), "model", "generate", "--model", model, "--prompt", text, "--max-new-tokens", "0", "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["prompt_tokens"]


def load_llama(model, threads):
    try:
        import llama_cpp
    except ImportError:
        sys.exit(f"llama-cpp-python is missing: {LLAMA_CPP_BUILD}")
    return llama_cpp.Llama(model_path=model, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)


def last_logits(llm):
    """The logits row of the last evaluated token (llama-cpp-python fills `scores` only with
    logits_all, so read the context's buffer directly)."""
    import numpy as np

    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))


def llama_greedy(llm, tokens, n):
    """n greedy tokens after `tokens`, argmax of llama.cpp's raw logits (no sampler chain)."""
    import numpy as np

    llm.reset()
    llm.eval(tokens)
    out = []
    for _ in range(n):
        tok = int(np.argmax(last_logits(llm)))
        out.append(tok)
        llm.eval([tok])
    return out
