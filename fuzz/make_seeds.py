#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzz targets (fuzz/corpus/<target>/): a few small valid
files of each format and a few edge cases. Re-run after a format change: python3 fuzz/make_seeds.py.
The crash inputs found by fuzzing (crash-*) are added beside these by hand and never regenerated."""
import json
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


# ---- shard_header: docs/formats.md / cemfrac/data/shard.h layout ----
def shard(tokens, vocab, eot, tokenizer, dtype=None, version=1, docs=None):
    dtype = dtype or (2 if vocab <= 65536 else 4)
    body = b"".join(struct.pack("<H" if dtype == 2 else "<I", t) for t in tokens)
    docs = tokens.count(eot) if docs is None else docs
    h = b"CEMFTOKS" + struct.pack("<IIIIqqq", version, 128, dtype, eot, vocab, len(tokens), docs)
    h += tokenizer.encode().ljust(64, b"\0")
    h += struct.pack("<I", zlib.crc32(body)) + b"\0" * 8
    h += struct.pack("<I", zlib.crc32(h))
    assert len(h) == 128
    return h + body


hi = list(b"hi there") + [256] + list(b"bye") + [256]
put("shard_header", "byte.bin", shard(hi, 257, 256, "byte"))
put("shard_header", "empty.bin", shard([], 257, 256, "byte"))
put("shard_header", "u32.bin", shard([70000, 5, 69999, 99999], 100000, 99999, "sp:100000"))
put("shard_header", "gpt2.bin", shard([15496, 995, 50256], 50257, 50256, "gpt2"))
put("shard_header", "truncated.bin", shard(hi, 257, 256, "byte")[:140])
put("shard_header", "header-only.bin", shard(hi, 257, 256, "byte")[:128])
put("shard_header", "bad-version.bin", shard(hi, 257, 256, "byte", version=2))
put("shard_header", "id-too-big.bin", shard([300, 256], 257, 256, "byte"))


# ---- safetensors ----
def safetensors(tensors, metadata=None, pad=True):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


f32 = lambda *v: struct.pack("<%df" % len(v), *v)
put("safetensors", "two.safetensors", safetensors(
    {"w": ("F32", [2, 2], f32(1, 2, 3, 4)), "b": ("F32", [2], f32(0.5, -0.5))},
    {"format": "pt", "producer": "cemfrac"}))
put("safetensors", "empty.safetensors", safetensors({}))
put("safetensors", "scalar.safetensors", safetensors({"s": ("F64", [], struct.pack("<d", 3.25))}))
put("safetensors", "zero-dim.safetensors", safetensors({"z": ("F32", [0, 3], b""), "i": ("I32", [1], b"\1\0\0\0")}))
put("safetensors", "dtypes.safetensors", safetensors({
    "a": ("BF16", [1], b"\x80\x3f"), "b": ("F16", [1], b"\x00\x3c"), "c": ("BOOL", [2], b"\1\0"),
    "d": ("U8", [1], b"\7"), "e": ("I8", [1], b"\xff"), "f": ("I16", [1], b"\1\0"), "g": ("I64", [1], b"\1" + b"\0" * 7)}))
put("safetensors", "truncated.safetensors", safetensors({"w": ("F32", [2, 2], f32(1, 2, 3, 4))})[:-3])

# ---- run_config: a small config of each kind and edge cases ----
put("run_config", "tiny.toml", """[model]
vocab_size = 512
d_model = 64
n_layers = 2
n_heads = 4
d_ff = 128
context = 64
mixer = "cem_attention"
ffn = "cffn"
layer_overrides = [{ layer = 1, mixer = "mha", ffn = "swiglu" }]
rope_scaling = { type = "llama3", factor = 8.0 }

[model.cem]
steps = 2
rope_mode = "naive"

[model.cofrgenet]
ladders = 2
depth = 3

[data]
path = "data/brown"

[train]
steps = 20
micro_batch = 4
tokens_per_step = 512
lr_max = 3e-3
seed = 7
out = "runs/tiny"
dyadic = false

[eval]
stride = 32
""")
put("run_config", "empty.toml", "")
put("run_config", "gpt2.toml", """# GPT-2 flavour
[model]
norm = "layernorm"
positions = "learned"
bias = true
tie_embeddings = true
norm_eps = 1e-5
init_std = 0.02
""")
put("run_config", "bad-key.toml", "[train]\nstep = 3\n")
put("run_config", "bad-syntax.toml", "[model\nd_model = \n")
put("run_config", "strings.toml", "[train]\nout = 'runs/\\u00e9 x'\n[data]\npath = \"\"\"multi\nline\"\"\"\n")

# ---- set_override: one override per line ----
put("set_override", "steps", "train.steps=20")
put("set_override", "several", "model.mixer=mha\nmodel.d_model=64\ntrain.lr_max=1e-3\ntrain.dyadic=false")
put("set_override", "nested", "model.cem.steps=4\nmodel.cem.rope_mode=none")
put("set_override", "array", 'model.layer_overrides=[{layer=0, mixer="mha"}]')
put("set_override", "string", 'train.out="runs/a b"\ndata.path=data/x')
put("set_override", "bad", "steps\n=\nmodel.=1\ntrain..steps=2")
put("set_override", "table", "model.rope_scaling={type=\"llama3\", factor=4.0}")

# ---- model_config_json: config.json (missing keys keep their defaults) ----
full = {
    "vocab_size": 512, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 128,
    "context": 64, "mixer": "mha", "ffn": "swiglu",
    "layer_overrides": [{"layer": 1, "mixer": "cem_attention", "ffn": "cem_mlp"}],
    "norm": "rmsnorm", "norm_eps": 1e-5, "positions": "rope", "rope_theta": 10000.0,
    "rope_scaling": {"type": "none", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_context": 8192},
    "bias": False, "tie_embeddings": False, "init_std": 0.02,
    "cem": {"steps": 1, "freeze_eta": False, "rope_mode": "exact", "dlr": "none", "dlr_distance": False,
            "precond": False, "precond_rank": 16, "precond_psd": False, "mlp_form": "a", "recursion": "auto"},
    "cofrgenet": {"eps": 0.01, "impl": "fused", "backward": "surrogate", "truncate": False, "eval_clip": True,
                  "ladders": 3, "depth": 5, "ladder_bias": True, "gate": "sigmoid", "glu": False,
                  "direct_raw": False, "univariate": False, "length": 0, "u_depth": 5, "u_bias": True,
                  "m_ladders": 3, "m_depth": 3, "m_heads": 1, "m_out_proj": False, "synth_hidden": 0,
                  "sparse_pattern": "fixed", "sparse_block": 0, "sparse_summary": 1},
}
put("model_config_json", "full.json", json.dumps(full, indent=2))
put("model_config_json", "partial.json", json.dumps({"vocab_size": 257, "d_model": 32, "n_heads": 2, "mixer": "cattn_m"}))
put("model_config_json", "empty.json", "{}")
put("model_config_json", "cem-not-object.json", json.dumps({"cem": 3}))
put("model_config_json", "wrong-type.json", json.dumps({"d_model": "64", "bias": 1}))

# ---- trainer_json ----
trainer = {"format": "cemfrac-checkpoint", "format_version": 1, "step": 20, "tokens": 10240,
           "data_seed": 1234, "loader": {"epoch": 0, "index": 20}, "torch_rng": "AAECAw==",
           "schedule": {"kind": "cosine", "lr_max": 0.003, "lr_min": 0.0003, "warmup_steps": 2, "total_steps": 20},
           "lr": 0.0003, "last_loss": 4.5, "last_val_loss": None, "best_val_loss": 4.75, "elapsed_s": 1.5}
put("trainer_json", "trainer.json", json.dumps(trainer, indent=2))
put("trainer_json", "wrong-version.json", json.dumps(dict(trainer, format_version=2)))
put("trainer_json", "negative.json", json.dumps(dict(trainer, step=-1)))
put("trainer_json", "bad-base64.json", json.dumps(dict(trainer, torch_rng="A=B=")))
put("trainer_json", "empty.json", "{}")

# ---- tokenizer_manifest: tokenizer.json ----
def manifest(kind, id_, vocab, eot, files=None):
    m = {"format": "cemfrac-tokenizer", "format_version": 1, "kind": kind, "id": id_, "vocab_size": vocab, "eot_id": eot}
    if files is not None:
        m["files"] = files
    return json.dumps(m, indent=2)


put("tokenizer_manifest", "byte.json", manifest("byte", "byte", 257, 256, {}))
put("tokenizer_manifest", "gpt2.json", manifest("gpt2", "gpt2", 50257, 50256, {"encoder": "encoder.json", "merges": "vocab.bpe"}))
put("tokenizer_manifest", "sp.json", manifest("sp", "sp:4096", 4096, 1, {"model": "junk"}))
put("tokenizer_manifest", "swapped-files.json", manifest("gpt2", "gpt2", 50257, 50256, {"encoder": "vocab.bpe", "merges": "junk"}))
put("tokenizer_manifest", "mismatch.json", manifest("byte", "byte", 300, 256))
put("tokenizer_manifest", "traversal.json", manifest("gpt2", "gpt2", 50257, 50256, {"encoder": "../x", "merges": ".."}))

# ---- gpt2_encode: arbitrary bytes ----
put("gpt2_encode", "ascii", "Hello world, it's 2026! I'll say: 'twas   fine.\n\n")
put("gpt2_encode", "unicode", "Grüße, 東京 🙂 — naïve café ١٢٣ \u00a0\u3000x")
put("gpt2_encode", "spaces", "   \t\n  a  \r\n\r\n")
put("gpt2_encode", "eot", "<|endoftext|>text<|endoftext|>")
put("gpt2_encode", "invalid", b"ok \xc3\x28 \xed\xa0\x80 \xf4\x90\x80\x80")
put("gpt2_encode", "long-word", "x" * 300 + " " + "9" * 40)

# ---- gpt2_files: byte 0 = mode, then edits (see fuzz_gpt2_files.cpp) ----
put("gpt2_files", "unchanged-encoder", b"\0")
put("gpt2_files", "unchanged-merges", b"\1")
put("gpt2_files", "edit-encoder", b"\0" + bytes([10, 0, 0, 3]) + b'"x"' + bytes([0, 1, 0, 0x85]))
put("gpt2_files", "edit-merges", b"\1" + bytes([20, 0, 0, 0x82]) + bytes([0, 0, 0, 3]) + "\u0120t".encode())
put("gpt2_files", "raw-tiny", b"\2" + b'{"!": 0, "<|endoftext|>": 50256}' + b"\0#version: 0.2\n! !\n")

# ---- task_file: JSON Lines task files (cemfrac/eval/task_file.h) ----
put("task_file", "choice.jsonl",
    '{"context": "The sky is", "choices": [" blue", " green"], "gold": 0}\n'
    '{"context": "Two and two make", "choices": [" four", " five", " six"], "gold": 0, "id": 3}\n')
put("task_file", "cloze.jsonl", '{"context": "Once upon a", "target": " time"}\n')
put("task_file", "lambada.jsonl", '{"text": "He opened the door and saw his old friend"}\n')
put("task_file", "rolling.jsonl", '{"text": "A page of text."}\n{"page": " = Title = \\n body"}\n')
put("task_file", "mixed.jsonl", '{"context": "a", "target": " b"}\n{"text": "c"}\n')
put("task_file", "bad-gold.jsonl", '{"context": "x", "choices": [" a", " b"], "gold": 2}\n')
put("task_file", "blank-line.jsonl", '{"text": "a"}\n\n{"text": "b"}\n')
put("task_file", "unicode.jsonl", '{"context": "The sky is", "choices": [" \u00f1and\u00fa", " zo\u00eb"], "gold": 0}\n')

# ---- glue_file: byte 0 picks the GLUE task (cola sst2 mrpc qqp stsb mnli qnli rte wnli), the rest is
# its TSV; the whole input split at its first NUL is a plain TSV task's train.tsv and dev.tsv ----
GLUE = ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"]
glue = {
    "cola": "gj04\t1\t\tOur friends won't buy this analysis.\ngj04\t0\t*\tOne more pseudo generalization.\n",
    "sst2": "sentence\tlabel\nhide new secretions \t0\nthe greatest musicians \t1\n",
    "mrpc": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t702876\t702977\tAmrozi accused.\tHe accused.\n",
    "qqp": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n1\t2\t3\tHow is life?\tWhat is life?\t0\n",
    "stsb": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
            "0\tmain\tMSRvid\t2012\t0001\tnone\tnone\tA plane.\tAn air plane.\t5.000\n",
    "mnli": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
            "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
            "0\t1\t1n\tgov\t( x )\t( y )\t(ROOT x)\t(ROOT y)\tCream skimming.\tProduct.\tneutral\tneutral\n",
    "qnli": "index\tquestion\tsentence\tlabel\n0\tWhen?\tIn 1990.\tentailment\n",
    "rte": "index\tsentence1\tsentence2\tlabel\n0\tNo weapons.\tWeapons.\tnot_entailment\n",
    "wnli": "index\tsentence1\tsentence2\tlabel\n0\tI stuck a pin.\tIt had a hole.\t1\n",
}
for i, task in enumerate(GLUE):
    put("glue_file", task + ".tsv", bytes([i]) + glue[task].encode())
put("glue_file", "tsv-task", bytes([0]) + b"good film\tpos\nbad film\tneg\n\0fine film\tpos\n")
put("glue_file", "stsb-nan", bytes([4]) + glue["stsb"].replace("5.000", "nan").encode())
put("glue_file", "short-line", bytes([7]) + b"index\tsentence1\tsentence2\tlabel\n0\tonly one\n")
