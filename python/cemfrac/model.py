"""cemfrac language models (LmModel) as torch.nn.Modules: a checkpoint or a fresh model from a config."""
import json
import os
from typing import Iterable, Optional

import torch

from . import _C
from ._cpp_module import CppModule
from .tokenizer import Tokenizer


class Model(CppModule):
    """A cemfrac decoder-only LM: forward(tokens) with int64 tokens (B, N), N <= context, returns
    float logits (B, N, V), computed by the C++ engine (the same numbers `cemfrac eval` and
    `cemfrac generate` use). Parameters are named as in model.safetensors (docs/formats.md).

    cemfrac.load(path) reads a checkpoint; Model.from_config({...}) builds a fresh one (initialised
    from torch's default generator, like `cemfrac train` after the same torch.manual_seed)."""

    def __init__(self, handle):
        super().__init__(handle)
        t = handle.tokenizer
        self.tokenizer: Optional[Tokenizer] = Tokenizer(t) if t is not None else None
        self.checkpoint: str = handle.checkpoint
        self.step: int = handle.step

    @classmethod
    def from_config(cls, config: dict) -> "Model":
        """A new model; `config` holds ModelConfig fields (config.json's / the TOML [model] keys;
        nested groups as dicts: {"cofrgenet": {"ladders": 3}}); missing ones keep their defaults."""
        return cls(_C.Model.create(json.dumps(config)))

    @property
    def config(self) -> dict:
        """Every ModelConfig field, as in the checkpoint's config.json."""
        return json.loads(self._cpp.config_json())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # An id outside the vocabulary is named here, not as LibTorch's "index out of range in self".
        if isinstance(tokens, torch.Tensor) and not tokens.is_meta and tokens.numel() > 0 \
                and not tokens.is_floating_point():
            low, high = int(tokens.min()), int(tokens.max())
            vocab = self._vocab_size()
            if low < 0 or high >= vocab:
                bad = low if low < 0 else high
                raise _C.Error(f"cemfrac.Model: token id {bad} is outside the vocabulary "
                               f"(0..{vocab - 1}, model vocab_size {vocab})")
        return self._cpp.forward(tokens)

    def score(self, requests, batch: int = 8):
        """Log-likelihoods as `cemfrac eval --task` computes them: each request is (tokens,
        score_from); returns (summed log-likelihood of tokens[score_from:], targets scored, whether
        every target is the argmax) per request, `batch` rows per forward, without gradients. Build
        requests with cemfrac.loglikelihood_request / cemfrac.rolling_requests."""
        return self._cpp.score([(list(map(int, t)), int(f)) for t, f in requests], int(batch))

    def generate(self, prompts, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, stop_at_eot: bool = True):
        """New tokens after each prompt (lists of ids), decoded as one batch with the decode cache,
        as `cemfrac generate --prompts` does: temperature 0 is greedy; each row draws from a
        generator of its own seeded by `seed`. Stops at the end-of-text id (not returned) when
        stop_at_eot, after max_new_tokens, or when the context is full. Never draws the padding
        rows beyond the tokenizer's vocabulary."""
        tok = self.tokenizer
        eos = tok.eot_id if (stop_at_eot and tok is not None) else -1
        limit = tok.vocab_size if tok is not None else -1
        return self._cpp.generate([list(map(int, p)) for p in prompts], int(max_new_tokens),
                                  float(temperature), int(top_k), float(top_p), int(seed), eos, limit)

    def _vocab_size(self) -> int:
        if getattr(self, "_vocab", None) is None:
            self._vocab = int(json.loads(self._cpp.config_json())["vocab_size"])
        return self._vocab


def load(path, overrides: Iterable[str] = (), device="cpu") -> Model:
    """The model of a checkpoint directory, or of a run directory's newest complete checkpoint, in eval
    mode (ladder ranges for eval clipping loaded). overrides: as `cemfrac eval --set`, only the
    architecture fields no parameter shape depends on, e.g. ["model.cem.steps=4"]. device: where the
    model is built and the checkpoint's tensors are copied ("cpu", "cuda", "cuda:N", "meta" or a
    torch.device; a checkpoint saved from any device loads on any other). The checkpoint's tokenizer
    is model.tokenizer (None if it has none)."""
    return Model(_C.Model.load(os.fspath(path), [str(o) for o in overrides], str(device)))


def loglikelihood_request(tokenizer: Tokenizer, context: str, continuation: str):
    """(tokens, score_from) scoring `continuation` after `context` as `cemfrac eval --task` and the
    harness do (docs/evaluation.md): trailing whitespace of the context moves to the continuation,
    the end-of-text id goes in front (cemfrac's documents follow one)."""
    return _C.loglikelihood_request(tokenizer._t, context, continuation)


def rolling_requests(tokenizer: Tokenizer, text: str, context: int, stride: int = 0):
    """The requests scoring every token of `text` once after the end-of-text id, in windows of at
    most `context` inputs (stride 0 = context: the harness's loglikelihood_rolling windows)."""
    return _C.rolling_requests(tokenizer._t, text, int(context), int(stride))


__all__ = ["Model", "load", "loglikelihood_request", "rolling_requests"]
