"""Differentiable functions computed by cemfrac's fused CPU kernels.

Each is a dispatcher operator, torch.ops.cemfrac.<name>, registered when cemfrac is imported (the
same operators the C++ engine calls; docs/python.md, "Operators")."""
import torch

from . import _C

__all__ = ["continued_fraction"]


def continued_fraction(a: torch.Tensor, eps: float = 0.01, dim: int = -1, backward: str = "surrogate",
                       impl: str = "fused") -> torch.Tensor:
    """Continued fractions ("ladders") f = 1 / (a_1 + 1 / (a_2 + ... + 1 / a_d)) along `dim` of `a`.

    a: float32 or float64 tensor (bfloat16 / float16 are computed in float32), any shape and strides;
    the dimension `dim` (default the last) holds a_1..a_d, d >= 1, and every other dimension is a
    batch of ladders. Returns a's shape without `dim`, in a's dtype. Differentiable in `a`.

    Computed with continuants, f = K_{d-1} / K̂_d, with ONE division per ladder: K̂_d is the
    sign-preserving clamp sgn(K_d) max(|K_d|, eps), sgn(0) = +1, so near a pole (K_d -> 0) f stays
    finite, |f| <= |K_{d-1}| / eps. eps = 0 gives the unguarded map (inf/nan at a pole). Where no
    clamp is active f equals the nested fraction exactly.

    backward: gradient where the clamp is active (identical elsewhere). "surrogate" (default, the
      paper's): Proposition 1, df/da_k = (-1)^k (K_{d-k} / K̂_d)^2. "exact": the derivative of the
      clamped map, in which K̂_d is a constant.
    impl: "fused" (the operator torch.ops.cemfrac.continuant: the fused kernel on the CPU, its ATen
      twin elsewhere), "reference" (the same math in ATen ops, the closed-form gradient) or
      "literal" (the nested fraction with a guarded reciprocal at every level: a different function
      near poles, the paper's CoFrGeNet-B). All three are differentiable twice and more: the
      closed-form backward is itself differentiated exactly under create_graph.
    dim: -2 on an (..., d, L) tensor is the kernel's own layout (no copy); any other dim costs one
      transposing copy of `a` in the forward.

    Overflow and non-finite inputs (docs/layers/ladders.md): the continuants can overflow while f
    does not (|K_j| grows like prod(|a_k| + 1), e.g. every a_k = 1e30 in float32); the fused kernel
    then recomputes that ladder on a slow path with a separate exponent per continuant, so for any
    finite input f is finite whenever K_{d-1} / K̂_d is representable (|f| <= |K_{d-1}| / eps) and the
    gradient is finite whenever the exact gradient is (mixing zeros and huge values can make the exact
    gradient itself exceed the dtype: a = (0, 1e30) has df/da_1 = -1e60). impl="reference" and
    "literal" have no slow path: they give inf or nan there. Non-finite inputs are not guarded: a nan
    anywhere in a ladder gives nan f and gradients for that ladder only (the others keep their bits);
    +-inf follows IEEE arithmetic (d = 1: f(+-inf) = +-0; deeper ladders give inf / inf = nan).

    Calls from several Python threads run concurrently (the GIL is released).
    """
    return _C.continued_fraction(a, float(eps), int(dim), str(backward), str(impl))
