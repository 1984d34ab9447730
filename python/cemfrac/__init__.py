"""cemfrac from Python: the fused continued-fraction op, every mixer and FFN kind as a torch.nn.Module,
cemfrac checkpoints as modules, and the tokenizers (docs/python.md).

    import torch, cemfrac
    f = cemfrac.ops.continued_fraction(a, eps=0.01)      # a: (..., d); autograd through the fused kernel
    layer = cemfrac.layers.Cffn(d_model=256, ladders=3, depth=5)
    model = cemfrac.load("runs/quickstart-llama")        # model(ids) -> logits, as the C++ engine computes
    tok = cemfrac.Tokenizer.load("data/brown/tokenizer")

Everything runs in cemfrac's C++ engine, in the same LibTorch as torch (Debian's python3-torch).
Errors from C++ arrive as cemfrac.Error (a ValueError) with the engine's one-line message.
"""
import torch  # noqa: F401  (loads LibTorch and torch's Python bindings, which _C links against)

from . import _C

Error = _C.Error
__version__ = _C.version()

from . import ops  # noqa: E402
from . import layers  # noqa: E402
from .model import Model, load, loglikelihood_request, rolling_requests  # noqa: E402
from .tokenizer import Tokenizer  # noqa: E402

__all__ = ["Error", "Model", "Tokenizer", "layers", "load", "loglikelihood_request", "ops",
           "rolling_requests", "__version__"]
