"""cemfrac.load: a checkpoint trained by the CLI, as a torch.nn.Module whose loss over a shard equals
`cemfrac eval`'s; the checkpoint's tokenizer; cemfrac.Tokenizer.load; errors."""
import json
import math
import os
import struct
import subprocess

import pytest
import torch
import torch.nn.functional as F

from _support import CEMFRAC_EXE, ROOT, cemfrac, tiny_corpus

pytestmark = pytest.mark.skipif(not os.path.exists(CEMFRAC_EXE), reason=f"no {CEMFRAC_EXE}")
CONTEXT = 32


def cli(*args):
    r = subprocess.run([CEMFRAC_EXE, "--threads", "1", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A byte-tokenized corpus of synthetic documents, and a tiny Llama trained on it for 4 steps."""
    root = tmp_path_factory.mktemp("model")
    data = tiny_corpus(root)["byte"]
    out = root / "run"
    cli("train", "--config", os.path.join(ROOT, "configs", "tiny-llama.toml"),
        "--set", f"data.path={data}", "--set", f"train.out={out}", "--set", "train.steps=4",
        "--set", "train.micro_batch=2", "--set", "train.eval_every=0", "--set", "train.warmup_steps=1",
        "--set", f"model.context={CONTEXT}", "--set", "model.vocab_size=260")
    return {"data": data, "run": out}


def read_shard(path):
    """Token ids of a shard (docs/formats.md: 128-byte header, dtype code at 16, count at 32)."""
    raw = path.read_bytes()
    width, = struct.unpack_from("<I", raw, 16)
    count, = struct.unpack_from("<Q", raw, 32)
    fmt = {2: "H", 4: "I"}[width]
    return list(struct.unpack_from(f"<{count}{fmt}", raw, 128))


def windows(n, context, stride):
    """The sliding windows `cemfrac eval` documents (cemfrac/eval/perplexity.h), as (begin, end,
    score_from)."""
    end = min(n, context + 1)
    out = [(0, end, 1)]
    while end < n:
        prev, end = end, min(n, end + stride)
        out.append((max(0, end - context - 1), end, prev))
    return out


def test_load_gives_the_engines_loss_over_a_shard(run):
    model = cemfrac.load(run["run"])
    assert isinstance(model, torch.nn.Module) and not model.training
    assert model.config["context"] == CONTEXT and model.step == 4
    # `cemfrac eval --data` puts an end-of-text in front: every document then follows one.
    tokens = [model.tokenizer.eot_id] + read_shard(run["data"] / "test.bin")
    stride = CONTEXT // 2
    total, scored = 0.0, 0
    with torch.no_grad():
        for begin, end, score_from in windows(len(tokens), CONTEXT, stride):
            ids = torch.tensor(tokens[begin:end], dtype=torch.int64)
            logits = model(ids[:-1].unsqueeze(0))[0]
            losses = F.cross_entropy(logits.float(), ids[1:], reduction="none")
            first = score_from - (begin + 1)  # local index of the first scored target
            total += losses[first:].double().sum().item()
            scored += len(losses) - first
    ours = total / scored
    report = json.loads(cli("eval", "--checkpoint", str(run["run"]), "--data", f"{run['data']}:test",
                            "--stride", str(stride), "--json"))
    assert report["tokens_scored"] == scored
    # Same weights, same C++ forward; the engine batches windows (8 per forward) where we run one at
    # a time, which may change float32 logits by a few ulps: far below the 1e-6 asked.
    assert abs(report["mean_loss"] - ours) <= 1e-6, (report["mean_loss"], ours)
    assert math.isfinite(ours)


def test_parameters_and_state_dict(run):
    model = cemfrac.load(run["run"])
    names = [k for k, _ in model.named_parameters()]
    assert names[0] == "wte.weight" and "norm_f.weight" in names and "blocks.1.attn.w_qkv" in names
    assert set(model.state_dict()) >= set(names)
    logits = model(torch.tensor([[1, 2, 3]]))
    assert logits.shape == (1, 3, model.config["vocab_size"])


def test_score_and_generate_match_full_forwards(run):
    """Model.score (what `cemfrac eval --task` scores with) and Model.generate (the batched decode
    cache) against the definitions: summed float64 log-softmax of full forwards, greedy argmax."""
    model = cemfrac.load(run["run"])
    tok = model.tokenizer
    reqs = [cemfrac.loglikelihood_request(tok, "The jury said ", "it did"),
            cemfrac.loglikelihood_request(tok, "", "an election")]
    assert reqs[0][0][0] == tok.eot_id and reqs[1][0] == [tok.eot_id] + tok.encode("an election")
    # the trailing space moved from the context to the continuation
    assert reqs[0][0][reqs[0][1]:] == tok.encode(" it did")
    reqs += cemfrac.rolling_requests(tok, "the jury " * 20, CONTEXT)
    assert len(reqs) == 2 + math.ceil((1 + 180) / CONTEXT)
    for (tokens, start), (ll, n, greedy) in zip(reqs, model.score(reqs, batch=2)):
        with torch.no_grad():
            x = torch.tensor([tokens[-CONTEXT - 1:][:-1]])
            lp = torch.log_softmax(model(x).double(), -1)[0]
        targets = tokens[-CONTEXT - 1:][1:]
        first = len(targets) - (len(tokens) - start)
        want = sum(lp[i, targets[i]].item() for i in range(first, len(targets)))
        assert n == len(tokens) - start and math.isclose(ll, want, rel_tol=1e-5, abs_tol=1e-4)
        assert greedy == all(int(lp[i].argmax()) == targets[i] for i in range(first, len(targets)))
    prompts = [tok.encode("The jury"), tok.encode("An")]
    for prompt, got in zip(prompts, model.generate(prompts, 6, stop_at_eot=False)):
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(6):
                seq.append(int(model(torch.tensor([seq]))[0, -1, :tok.vocab_size].argmax()))
        assert got == seq[len(prompt):]


def test_tokenizers(run):
    tok = cemfrac.Tokenizer.load(run["data"] / "tokenizer")
    ids = tok.encode("The jury said")
    assert ids == [ord(c) for c in "The jury said"]  # byte tokenizer: the UTF-8 bytes
    assert tok.decode(ids) == "The jury said" and tok.id == "byte" and tok.eot_id == 256
    model = cemfrac.load(run["run"])
    assert model.tokenizer.id == "byte" and model.tokenizer.encode("é") == [0xC3, 0xA9]
    assert tok.decode([0xC3]) == "\ufffd" and tok.decode_bytes([0xC3]) == b"\xc3"


def test_errors(run, tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(cemfrac.Error) as info:
        cemfrac.load(missing)
    r = subprocess.run([CEMFRAC_EXE, "eval", "--checkpoint", str(missing), "--data", f"{run['data']}:test"],
                       capture_output=True, text=True)
    # One line each, naming what the caller wrote: Python's arguments, the CLI's flags.
    assert "\n" not in str(info.value) and str(info.value).startswith(f"cemfrac.load: path {missing}")
    assert "--" not in str(info.value) and f"--checkpoint {missing}" in r.stderr
    for overrides, needle in [(["model.d_model=8"], "cemfrac.load: override model.d_model=8"),
                              (["model.cem.steps=zero"], "cemfrac.load: override model.cem.steps=zero"),
                              (["steps"], "cemfrac.load: override steps")]:
        with pytest.raises(cemfrac.Error) as info:
            cemfrac.load(run["run"], overrides)
        assert needle in str(info.value) and "--set" not in str(info.value), str(info.value)
    model = cemfrac.load(run["run"])
    with pytest.raises(cemfrac.Error, match="model input must be int64 token ids"):
        model(torch.zeros(1, 3))
    with pytest.raises(cemfrac.Error, match="sequence too long"):
        model(torch.zeros(1, CONTEXT + 1, dtype=torch.int64))
    # Ids outside the vocabulary are named, not "index out of range in self".
    vocab = model.config["vocab_size"]
    for bad in (vocab, 5000 + vocab, -1):
        with pytest.raises(cemfrac.Error, match=f"token id {bad} is outside the vocabulary"):
            model(torch.tensor([[1, bad]], dtype=torch.int64))
    with pytest.raises(cemfrac.Error):
        cemfrac.Tokenizer.load(tmp_path)


def test_load_a_fine_tuned_checkpoint(run, tmp_path):
    """`cemfrac finetune` leaves an ordinary checkpoint: cemfrac.load gives its backbone (the head's
    cls.* tensors are set aside), which fine-tuning changed, and `cemfrac eval` agrees with it."""
    data = tmp_path / "tsv"
    data.mkdir()
    rows = "".join(f"the jury said {w}\t{i % 2}\n" for i, w in enumerate("it did find that an election".split()))
    (data / "train.tsv").write_text(rows)
    (data / "dev.tsv").write_text(rows)
    out = tmp_path / "ft"
    report = json.loads(cli("finetune", "--checkpoint", str(run["run"]), "--task", "tsv", "--data", str(data),
                            "--out", str(out), "--epochs", "1", "--batch", "3", "--lr", "1e-3", "--quiet", "--json"))
    assert report["steps"] == 2 and set(report["evals"]["dev"]) == {"acc", "examples", "majority"}
    tuned, pre = cemfrac.load(out), cemfrac.load(run["run"])
    names = [k for k, _ in tuned.named_parameters()]
    assert names == [k for k, _ in pre.named_parameters()] and not any(n.startswith("cls.") for n in names)
    assert tuned.step == 2
    assert not torch.equal(tuned.state_dict()["wte.weight"], pre.state_dict()["wte.weight"])
    text = tmp_path / "t.txt"
    text.write_text("the jury said it did find")
    ours = tuned(torch.tensor([[tuned.tokenizer.eot_id] + tuned.tokenizer.encode("the jury said it did find")]))
    assert ours.shape[-1] == tuned.config["vocab_size"]
    ev = json.loads(cli("eval", "--checkpoint", str(out), "--text", str(text), "--json"))
    assert math.isfinite(ev["mean_loss"])
