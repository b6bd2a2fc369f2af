#!/usr/bin/env python3
"""Convert a Whisper model in CTranslate2's format (model.bin + config.json) into the Hugging Face
layout that candle-transformers' whisper loads: model.safetensors with transformers'
WhisperForConditionalGeneration names, and a config.json whose sizes are read from the weights.

Usage: scripts/ct2-to-hf-whisper.py CT2_DIR OUT_DIR   (needs numpy and safetensors)

model.bin, as CTranslate2 writes it (python/ctranslate2/specs/model_spec.py, read back by
src/models/model.cc): little-endian; u32 binary version; from version 2 a spec name and a u32
spec revision; u32 variable count, then per variable a name, u8 rank, rank x u32 dims, u8 dtype,
u32 byte count and the bytes; then u32 alias count and (alias, target) name pairs. A string is
a u16 length that counts its trailing NUL, then the bytes.
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

# CTranslate2's DataType enum (include/ctranslate2/types.h).
DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


class Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, fmt):
        (value,) = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self):
        n = self.take("H")
        text = self.data[self.pos : self.pos + n - 1].decode()
        self.pos += n
        return text


def read_model_bin(path):
    r = Reader(path.read_bytes())
    version = r.take("I")
    if version < 2 or version > 6:
        sys.exit(f"{path}: CTranslate2 binary version {version} is not one this converter reads (2..6)")
    spec = r.string()
    r.take("I")  # spec revision
    if spec != "WhisperSpec":
        sys.exit(f"{path}: holds a {spec}, not a WhisperSpec: pass a CTranslate2 Whisper model")
    variables = {}
    for _ in range(r.take("I")):
        name = r.string()
        dims = [r.take("I") for _ in range(r.take("B"))]
        dtype = r.take("B")
        nbytes = r.take("I")
        if dtype not in DTYPES:
            sys.exit(f"{path}: {name} has CTranslate2 dtype {dtype}; only float and int types are read (re-export without quantization)")
        raw = r.data[r.pos : r.pos + nbytes]
        r.pos += nbytes
        variables[name] = np.frombuffer(raw, dtype=DTYPES[dtype]).reshape(dims)
    for _ in range(r.take("I")):
        alias, target = r.string(), r.string()
        variables[alias] = variables[target]
    if r.pos != len(r.data):
        sys.exit(f"{path}: {len(r.data) - r.pos} bytes left after the aliases: not a model.bin this converter understands")
    return variables


def linear(out, hf, weight, bias=None):
    out[hf + ".weight"] = weight
    if bias is not None:
        out[hf + ".bias"] = bias


def layer_norm(out, hf, v, ct):
    out[hf + ".weight"] = v[ct + "/gamma"]
    out[hf + ".bias"] = v[ct + "/beta"]


def attention(out, hf, v, ct, cross):
    """CTranslate2 fuses the projections (q|k|v for self-attention, k|v for cross-attention) into
    one matrix; transformers keeps them apart, and its k_proj has no bias (CTranslate2 stores zeros)."""
    d = v[ct + "/linear_0/weight"].shape[1]
    if cross:
        linear(out, hf + ".q_proj", v[ct + "/linear_0/weight"], v[ct + "/linear_0/bias"])
        kv_w, kv_b, out_name = v[ct + "/linear_1/weight"], v[ct + "/linear_1/bias"], "/linear_2"
        parts_w, parts_b = [None] + np.split(kv_w, 2), [None] + np.split(kv_b, 2)
    else:
        qkv_w, qkv_b, out_name = v[ct + "/linear_0/weight"], v[ct + "/linear_0/bias"], "/linear_1"
        parts_w, parts_b = np.split(qkv_w, 3), np.split(qkv_b, 3)
        linear(out, hf + ".q_proj", parts_w[0], parts_b[0])
    assert parts_w[1].shape == (d, d), f"{ct}: fused projection of unexpected shape"
    linear(out, hf + ".k_proj", parts_w[1])
    linear(out, hf + ".v_proj", parts_w[2], parts_b[2])
    linear(out, hf + ".out_proj", v[ct + out_name + "/weight"], v[ct + out_name + "/bias"])
    layer_norm(out, hf + "_layer_norm", v, ct + "/layer_norm")


def ffn(out, hf, v, ct):
    linear(out, hf + ".fc1", v[ct + "/linear_0/weight"], v[ct + "/linear_0/bias"])
    linear(out, hf + ".fc2", v[ct + "/linear_1/weight"], v[ct + "/linear_1/bias"])
    layer_norm(out, hf + ".final_layer_norm", v, ct + "/layer_norm")


def layers(v, side):
    i = 0
    while f"{side}/layer_{i}/ffn/linear_0/weight" in v:
        i += 1
    return i


def convert(v):
    out = {}
    for conv in ("conv1", "conv2"):
        linear(out, f"model.encoder.{conv}", v[f"encoder/{conv}/weight"], v[f"encoder/{conv}/bias"])
    out["model.encoder.embed_positions.weight"] = v["encoder/position_encodings/encodings"]
    for i in range(layers(v, "encoder")):
        hf, ct = f"model.encoder.layers.{i}", f"encoder/layer_{i}"
        attention(out, hf + ".self_attn", v, ct + "/self_attention", cross=False)
        ffn(out, hf, v, ct + "/ffn")
    layer_norm(out, "model.encoder.layer_norm", v, "encoder/layer_norm")
    out["model.decoder.embed_tokens.weight"] = v["decoder/embeddings/weight"]
    out["model.decoder.embed_positions.weight"] = v["decoder/position_encodings/encodings"]
    for i in range(layers(v, "decoder")):
        hf, ct = f"model.decoder.layers.{i}", f"decoder/layer_{i}"
        attention(out, hf + ".self_attn", v, ct + "/self_attention", cross=False)
        attention(out, hf + ".encoder_attn", v, ct + "/attention", cross=True)
        ffn(out, hf, v, ct + "/ffn")
    layer_norm(out, "model.decoder.layer_norm", v, "decoder/layer_norm")
    return {k: np.ascontiguousarray(t) for k, t in out.items()}


def hf_config(v, ct_config):
    """Sizes come from the weights themselves, so any Whisper size converts."""
    vocab, d_model = v["decoder/embeddings/weight"].shape
    return {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "d_model": int(d_model),
        "num_mel_bins": int(v["encoder/conv1/weight"].shape[1]),
        "encoder_layers": layers(v, "encoder"),
        "decoder_layers": layers(v, "decoder"),
        "encoder_attention_heads": int(v["encoder/num_heads"]),
        "decoder_attention_heads": int(v["decoder/num_heads"]),
        "encoder_ffn_dim": int(v["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "decoder_ffn_dim": int(v["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "max_source_positions": int(v["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(v["decoder/position_encodings/encodings"].shape[0]),
        "vocab_size": int(vocab),
        "suppress_tokens": ct_config.get("suppress_ids", []),
        "begin_suppress_tokens": ct_config.get("suppress_ids_begin", []),
        "activation_function": "gelu",
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "torch_dtype": "float16",
    }


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: ct2-to-hf-whisper.py CT2_DIR OUT_DIR")
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    variables = read_model_bin(src / "model.bin")
    ct_config = json.loads((src / "config.json").read_text()) if (src / "config.json").exists() else {}
    dst.mkdir(parents=True, exist_ok=True)
    save_file(convert(variables), str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(hf_config(variables, ct_config), indent=2) + "\n")
    (dst / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())


if __name__ == "__main__":
    main()
