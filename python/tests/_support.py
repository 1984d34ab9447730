"""Shared by the Python tests: imports cemfrac, or skips with the reason when it is not importable.

ctest runs these files with CEMFRAC_PYTHON_REQUIRED=1 (the module was configured to be built), and
then an import failure is an error, never a skip. By hand, without the module:
    PYTHONPATH=build/python /usr/bin/python3 -m pytest python/tests
"""
import os
import sys

import pytest

try:
    import torch  # noqa: F401
    import cemfrac  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the machine
    if os.environ.get("CEMFRAC_PYTHON_REQUIRED") == "1":
        raise
    pytest.skip(f"cemfrac Python module not importable ({e}); build it (scripts/build.sh) and run with "
                f"PYTHONPATH=build/python under /usr/bin/python3 (this is {sys.executable})",
                allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("CEMFRAC_BUILD_DIR", os.path.join(ROOT, "build"))
CEMFRAC_EXE = os.environ.get("CEMFRAC_EXE", os.path.join(BUILD, "tools", "cemfrac"))

# Unit roundoff of each dtype.
U = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24}


def cli(*args, ok=True):
    """Runs the cemfrac executable with one thread; with ok, asserts it succeeded."""
    import subprocess
    r = subprocess.run([CEMFRAC_EXE, "--threads", "1", *args], capture_output=True, text=True)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def tiny_corpus(root, tokenizers=("byte",)):
    """40 synthetic documents prepared with each tokenizer: {tokenizer: data directory}."""
    import random
    docs = root / "docs"
    docs.mkdir()
    rng = random.Random(0)
    words = "the jury said it did find that an election was conducted in city of atlanta".split()
    for i in range(40):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(20, 60))).capitalize() + ".\n"
        (docs / f"doc{i:02d}.txt").write_text(text)
    out = {}
    for tok in tokenizers:
        d = root / ("data-" + tok.replace(":", ""))
        cli("prepare", "--text", str(docs), "--tokenizer", tok, "--out", str(d))
        out[tok] = d
    return out


def train_tiny(out, data, preset, *sets, context=64):
    """A checkpoint of configs/<preset>.toml after 2 steps at a tiny learning rate from a wide init:
    logits far from uniform, so greedy decoding does not repeat one token. Returns the run folder."""
    cli("train", "--config", os.path.join(ROOT, "configs", f"{preset}.toml"), "--set", f"data.path={data}",
        "--set", f"train.out={out}", "--set", "train.steps=2", "--set", "train.micro_batch=2",
        "--set", "train.eval_every=0", "--set", "train.warmup_steps=1", "--set", "train.lr_max=1e-6",
        "--set", "train.lr_min=1e-7", "--set", "model.init_std=0.3", "--set", f"model.context={context}",
        "--set", "model.vocab_size=320", *[a for s in sets for a in ("--set", s)])
    return out
