"""`cemfrac export` and `cemfrac import` against the real Hugging Face transformers (pinned in
scripts/pip-interop.txt): an exported checkpoint loads with from_pretrained and gives cemfrac's logits
within a derived float32 bound and the same greedy tokens, its tokenizer gives cemfrac's ids; a model
made by transformers from a random config imports and gives its logits; export -> import is bitwise.

The bound: both sides compute the same function in float32. A float64 run of the transformers model is
the reference; cemfrac's float32 error against it must be within 8x transformers' own float32 error
against it, plus 64 units of roundoff of the largest logit (as tests/cuda/ bounds a GPU against the CPU).

scripts/pip-leg.sh runs this with CEMFRAC_INTEROP_REQUIRED=1: there a missing transformers is an error.
"""
import json
import os
import random
import subprocess

import pytest
import torch

from _support import CEMFRAC_EXE, ROOT, U, cemfrac, cli, tiny_corpus, train_tiny

try:
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError as e:  # pragma: no cover - depends on the machine
    if os.environ.get("CEMFRAC_INTEROP_REQUIRED") == "1":
        raise
    pytest.skip(f"transformers not importable ({e}): pip install -r scripts/pip-interop.txt",
                allow_module_level=True)

pytestmark = pytest.mark.skipif(not os.path.exists(CEMFRAC_EXE), reason=f"no {CEMFRAC_EXE}")
CONTEXT = 64
PROMPTS = ["the jury said", "An election was conducted in the city", "x"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A small corpus prepared with the byte tokenizer and with a SentencePiece one."""
    return tiny_corpus(tmp_path_factory.mktemp("hf"), ("byte", "sp:300"))


def train(out, data, preset, *sets):
    return train_tiny(out / preset, data, preset, *sets, context=CONTEXT)


def check_close(ours, hf_model, ids):
    """cemfrac's float32 logits vs the transformers model's, with the bound of the module docstring."""
    x = torch.tensor([ids])
    with torch.no_grad():
        a = ours(x)
        b = hf_model(x).logits
        ref = hf_model.double()(x).logits
        hf_model.float()
    own_err = (b.double() - ref).abs().max().item()
    bound = 8 * own_err + 64 * U[torch.float32] * ref.abs().max().item()
    err = (a.double() - ref).abs().max().item()
    assert err <= bound, f"cemfrac vs transformers float64: {err:.3g} > bound {bound:.3g}"
    return a


def greedy(ours, ids, n):
    """cemfrac's greedy continuation by full forwards (the definition, no cache)."""
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(ours(torch.tensor([seq]))[0, -1].argmax()))
    return seq[len(ids):]


@pytest.mark.parametrize("preset,tok,sets,cls", [
    ("tiny-gpt2", "byte", (), "GPT2LMHeadModel"),
    ("tiny-gpt2", "sp:300", ("model.tie_embeddings=false", "model.bias=false"), "GPT2LMHeadModel"),
    ("tiny-llama", "sp:300", (), "LlamaForCausalLM"),
    ("tiny-llama", "byte", ("model.bias=true", "model.tie_embeddings=true",
                            "model.rope_scaling.type=llama3", "model.rope_scaling.original_context=16",
                            "model.rope_scaling.factor=4"), "LlamaForCausalLM"),
    ("tiny-cem-both", "sp:300", ("model.cem.rope_mode=naive", "model.cem.freeze_eta=false",
                                 "model.cem.eta_init=0.7"), "LlamaForCausalLM"),
    ("tiny-cem-both", "byte", ("model.cem.rope_mode=naive", "model.cem.mlp_form=b"), "LlamaForCausalLM"),
])
def test_export_loads_in_transformers_with_cemfracs_logits(tmp_path, data, preset, tok, sets, cls):
    run = train(tmp_path, data[tok], preset, *sets)
    out = tmp_path / "hf"
    r = cli("export", "--checkpoint", str(run), "--out", str(out))
    assert cls in r.stdout
    ours = cemfrac.load(run)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(model).__name__ == cls
    hf_tok = AutoTokenizer.from_pretrained(out)
    for text in PROMPTS:
        ids = ours.tokenizer.encode(text)
        assert hf_tok.encode(text, add_special_tokens=False) == ids, text
        assert hf_tok.decode(ids) == text
        check_close(ours, model, ids)
        n = min(20, CONTEXT - len(ids))
        want = greedy(ours, ids, n)
        model.generation_config.eos_token_id = None  # exactly n tokens, end-of-text or not
        got = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
        assert got[0, len(ids):].tolist() == want
        assert len(set(want)) > 1  # a test of decoding, not of one repeated token


def test_export_refuses_what_no_stock_class_computes(tmp_path, data):
    cases = [("tiny-cem-both", (), "rope_mode = exact"),
             ("tiny-cem-both", ("model.cem.rope_mode=naive", "model.cem.steps=2"), "cem.steps = 2"),
             ("tiny-cofrgenet-f", (), "cffn"),
             ("tiny-llama", ("model.positions=none",), "positions = none")]
    for preset, sets, why in cases:
        run = train(tmp_path / preset.replace("-", "_") / str(len(sets)), data["byte"], preset, *sets)
        out = tmp_path / "refused"
        r = cli("export", "--checkpoint", str(run), "--out", str(out), ok=False)
        assert r.returncode == 1 and why in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1 and not out.exists()


def _random_hf(kind):
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=300, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=4,
                                      resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=80,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=CONTEXT, rope_theta=5000.0,
                                       tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # transformers zero-initialises biases and norms: make every tensor count
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_import_of_a_transformers_model_gives_its_logits(tmp_path, kind):
    model = _random_hf(kind)
    src = tmp_path / "src"
    model.save_pretrained(src)
    out = tmp_path / "run"
    r = cli("import", "--hf", str(src), "--out", str(out))
    assert "wte.weight" in r.stdout and "tokenizer: none" in r.stdout
    ours = cemfrac.load(out)
    ids = [random.Random(1).randrange(300) for _ in range(CONTEXT)]
    check_close(ours, model, ids)
    # export -> import -> export again: the second export's tensors equal the first's, bit for bit.
    again = tmp_path / "again"
    cli("export", "--checkpoint", str(out), "--out", str(again))
    from safetensors.torch import load_file
    first = load_file(str(src / "model.safetensors"))
    second = load_file(str(again / "model.safetensors"))
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


@pytest.mark.parametrize("tok,sets", [("byte", ()), ("sp:300", ("model.bias=true",))])
def test_export_then_import_is_bitwise(tmp_path, data, tok, sets):
    for preset in ("tiny-gpt2", "tiny-llama"):
        run = train(tmp_path / preset, data[tok], preset, *sets)
        hf = tmp_path / preset / "hf"
        cli("export", "--checkpoint", str(run), "--out", str(hf))
        back = tmp_path / preset / "back"
        r = cli("import", "--hf", str(hf), "--out", str(back))
        assert f"tokenizer: {tok}" in r.stdout
        a, b = cemfrac.load(run), cemfrac.load(back)
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys()
        for name in sa:
            assert torch.equal(sa[name], sb[name]), name
        ca, cb = a.config, b.config
        ca.pop("n_kv_heads"), cb.pop("n_kv_heads")  # 0 and H mean the same
        ca.pop("cem"), cb.pop("cem"), ca.pop("cofrgenet"), cb.pop("cofrgenet")  # unused by these kinds
        ca.pop("layer_overrides"), cb.pop("layer_overrides")
        assert ca == cb
        assert b.tokenizer.id == a.tokenizer.id
        # Every command that reads a checkpoint takes the imported one and gives the same numbers.
        split = f"{data[tok]}:test"
        la, lb = (json.loads(cli("eval", "--checkpoint", str(d), "--data", split, "--json").stdout)
                  for d in (run, back))
        assert la["mean_loss"] == lb["mean_loss"] and la["bits_per_byte"] == lb["bits_per_byte"]
        ga, gb = (subprocess.run([CEMFRAC_EXE, "--threads", "1", "generate", "--checkpoint", str(d),
                                  "--prompt", "the jury", "--temperature", "0", "--max-new-tokens", "12"],
                                 capture_output=True, check=True).stdout for d in (run, back))
        assert ga == gb and len(ga) > len("the jury")  # bytes: a random model's text need not be UTF-8
        cli("train", "--config", os.path.join(ROOT, "configs", f"{preset}.toml"), "--set",
            f"data.path={data[tok]}", "--set", f"train.out={tmp_path / preset / 'more'}", "--set",
            "train.steps=2", "--set", "train.eval_every=0", "--set", f"model.context={CONTEXT}",
            "--set", "model.vocab_size=320", "--set", f"train.init_from={back}",
            *[a for s in sets for a in ("--set", s)])
        tsv = tmp_path / preset / "tsv"
        tsv.mkdir()
        rows = "".join(f"the jury {'said' if i % 2 else 'did'} it\t{i % 2}\n" for i in range(8))
        (tsv / "train.tsv").write_text(rows)
        (tsv / "dev.tsv").write_text(rows)
        cli("finetune", "--checkpoint", str(back), "--task", "tsv", "--data", str(tsv), "--out",
            str(tmp_path / preset / "ft"), "--epochs", "1", "--batch", "4")
        assert (tmp_path / preset / "ft" / "finetune.json").exists()


def test_import_refusals(tmp_path):
    model = _random_hf("llama")
    src = tmp_path / "src"
    model.save_pretrained(src)
    cfg = json.loads((src / "config.json").read_text())

    def refused(mutate, why):
        d = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        for f in src.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        c = dict(cfg)
        mutate(c, d)
        (d / "config.json").write_text(json.dumps(c))
        r = cli("import", "--hf", str(d), "--out", str(d / "out"), ok=False)
        assert r.returncode == 1 and why in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1

    refused(lambda c, d: c.update(model_type="mistral"), 'model_type "mistral"')
    refused(lambda c, d: c.update(hidden_act="gelu"), "hidden_act")
    refused(lambda c, d: c.update(num_hidden_layers=3), "model.layers.2")
    refused(lambda c, d: c.update(rope_scaling={"rope_type": "yarn", "factor": 2.0}), "yarn")
    refused(lambda c, d: (d / "model.safetensors").unlink(), "no model.safetensors")
    refused(lambda c, d: (d / "model.safetensors").write_bytes(b"\x00" * 5), "model.safetensors")
    # a non-empty --out is refused before anything is written
    r = cli("import", "--hf", str(src), "--out", str(src), ok=False)
    assert r.returncode == 1 and "--out" in r.stderr
