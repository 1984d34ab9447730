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


__all__ = ["Model", "load"]
