"""cemfrac's tokenizers ("byte", "gpt2", "sp:N"), as saved beside prepared data and in checkpoints."""
import os
from typing import Iterable, List

from . import _C


class Tokenizer:
    """A cemfrac tokenizer. Tokenizer.load(dir) reads a saved one (data/brown/tokenizer, a checkpoint's
    tokenizer/); Tokenizer.make("byte" | "gpt2") builds a fixed one. encode(text) -> ids;
    decode(ids) -> text. The end-of-text id (eot_id) is never produced by encode()."""

    def __init__(self, handle):
        self._t = handle

    @classmethod
    def load(cls, path) -> "Tokenizer":
        return cls(_C.Tokenizer.load(os.fspath(path)))

    @classmethod
    def make(cls, spec: str) -> "Tokenizer":
        return cls(_C.Tokenizer.make(spec))

    @property
    def id(self) -> str:
        return self._t.id

    @property
    def vocab_size(self) -> int:
        return self._t.vocab_size

    @property
    def eot_id(self) -> int:
        return self._t.eot_id

    def encode(self, text: str) -> List[int]:
        return self._t.encode(text)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The text's bytes; ids that split a multi-byte character give bytes that are not UTF-8."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return self._t.decode_bytes([int(i) for i in ids])

    def decode(self, ids: Iterable[int]) -> str:
        """The text; bytes that are not valid UTF-8 (a character split by the ids) become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def save(self, path) -> None:
        self._t.save(os.fspath(path))

    def __repr__(self):
        return f"cemfrac.Tokenizer({self.id!r}, vocab_size={self.vocab_size})"
