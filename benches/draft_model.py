#!/usr/bin/env python3
"""A draft model for a GGUF with none of its size: the model's own first N layers, its final
norm and head (self-speculative decoding by layer skipping: Zhang et al., "Draft & Verify",
arXiv 2309.08168; Elhoushi et al., "LayerSkip", arXiv 2404.16710, early exit at layer N). It
shares the model's tokenizer by construction, costs about N/L of a pass, and guesses as well as
the model's early layers happen to predict its output (without LayerSkip's training, less well
than a trained small model would). SmolLM2-135M is the smallest of its family, so this is the
draft model `benches/drafting.py --draft-model` measures with.

    /work/venv/bin/python benches/draft_model.py --layers 10 [--model PATH] OUT.gguf

Needs the `gguf` package (pip install gguf).
"""
import argparse
import os
import sys

import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import model_path  # noqa: E402


def truncate(src, layers, out):
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    total = r.fields[f"{arch}.block_count"].contents()
    if not 0 < layers < total:
        sys.exit(f"--layers must be between 1 and {total - 1}: the model has {total}")
    w = gguf.GGUFWriter(out, arch)
    for name, field in r.fields.items():
        # The writer adds the header fields and the architecture itself.
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == f"{arch}.block_count":
            w.add_uint32(name, layers)
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for t in r.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and int(parts[1]) >= layers:
            continue
        # As stored: the reader shapes quantized data as rows of bytes, which the writer reads back.
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{out}: the first {layers} of {total} layers of {src}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--model")
    ap.add_argument("out")
    a = ap.parse_args()
    truncate(a.model or model_path(), a.layers, a.out)


if __name__ == "__main__":
    main()
