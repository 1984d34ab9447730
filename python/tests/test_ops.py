"""cemfrac.ops.continued_fraction: values against the definition and the C++ literal ladder, gradients
(float64 gradcheck, d = 1..8, near a pole), edge cases, errors, threads."""
import threading

import pytest
import torch

from _support import U, cemfrac

cf = cemfrac.ops.continued_fraction


def nested(a):
    """The definition, in plain PyTorch: a_1 + 1 / (a_2 + ... + 1 / a_d), inverted. a: (..., d)."""
    d = a.shape[-1]
    t = a[..., d - 1]
    for k in range(d - 2, -1, -1):
        t = a[..., k] + 1 / t
    return 1 / t


def tails(a):
    """K_0 .. K_d of a (..., d): K_0 = 1, K_{-1} = 0, K_j = a_{d-j+1} K_{j-1} + K_{j-2}."""
    d = a.shape[-1]
    prev, cur = torch.zeros_like(a[..., 0]), torch.ones_like(a[..., 0])
    out = [cur]
    for k in range(d, 0, -1):
        prev, cur = cur, a[..., k - 1] * cur + prev
        out.append(cur)
    return out


def positive(shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * 1.5 + 0.5).to(dtype)


def away_from_poles(shape, seed, margin=0.2):
    """Mixed-sign a (..., d) with every |K_j| >= margin for j >= 1 (so eps = 0.01 never acts and a
    finite difference of 1e-6 never crosses a kink)."""
    g = torch.Generator().manual_seed(seed)
    while True:
        a = (torch.rand(shape, generator=g, dtype=torch.float64) * 1.5 + 0.5)
        a = a * torch.where(torch.rand(shape, generator=g) < 0.3, -1.0, 1.0).double()
        if all(k.abs().min() >= margin for k in tails(a)[1:]):
            return a


# ---- values -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("d", [1, 2, 3, 5, 8])
def test_equals_definition_and_cpp_literal_ladder(dtype, d):
    # Positive a: every continuant and every partial fraction is a sum of positive terms, so there is
    # no cancellation and each operation adds at most one rounding (relative u). Continuants: K_j
    # takes j multiply-adds, relative error <= 2j u; f = K_{d-1} / K_d: <= (2(d-1) + 2d + 1) u
    # = (4d - 1) u. The nested fraction: one add and one reciprocal per level, a level's error shrunk
    # by t/(a+t) < 1 at the next: <= 2d u. Two such results differ by at most (6d - 1) u relatively.
    a = positive((64, d), dtype, seed=d)
    bound = 6 * d * U[dtype]
    f = cf(a, eps=0.01)
    ref = nested(a.double())  # the definition in float64: its own error (2d 2^-53) is inside the bound
    assert f.dtype == dtype and f.shape == (64,)
    assert torch.allclose(f.double(), ref, rtol=bound, atol=0)
    lit = cf(a, eps=0.01, impl="literal")  # C++ continuant_literal: the nested fraction, guarded
    assert torch.allclose(f.double(), lit.double(), rtol=bound, atol=0)
    assert torch.allclose(lit.double(), nested(a).double(), rtol=2 * d * U[dtype], atol=0)


def test_d1_is_guarded_reciprocal():
    a = torch.tensor([[2.0], [-4.0], [0.005], [-0.002], [0.0]], dtype=torch.float64)
    assert cf(a, eps=0.01).tolist() == [0.5, -0.25, 100.0, -100.0, 100.0]  # sgn(0) = +1
    assert torch.isinf(cf(a[4:], eps=0.0)).all()  # eps = 0: the unguarded map


def test_near_and_at_a_pole_matches_the_documented_clamp():
    # f = K_{d-1} / K̂_d with K̂_d = sgn(K_d) max(|K_d|, eps): finite at K_d = 0, |f| <= |K_{d-1}| / eps.
    eps = 0.01
    for d in range(1, 9):
        a = away_from_poles((6, d), seed=100 + d)
        k = tails(a)
        # Choose a_1 so that K_d = a_1 K_{d-1} + K_{d-2} hits the targets below (inside, at, outside).
        target = torch.tensor([0.0, eps / 2, -eps / 2, -0.0, 2 * eps, -3 * eps], dtype=torch.float64)
        kd2 = k[d - 2] if d >= 2 else torch.zeros(6, dtype=torch.float64)
        a[:, 0] = (target - kd2) / k[d - 1]
        kd = tails(a)[d]
        f = cf(a, eps=eps)
        clamped = torch.where(kd >= 0, kd.clamp_min(eps), kd.clamp_max(-eps))
        expect = tails(a)[d - 1] / clamped
        assert torch.isfinite(f).all()
        # The kernel's continuants are bitwise those of tails() (same recurrence, no contraction);
        # it then takes f = K_{d-1} * (1 / K̂_d), two roundings against one here: within 3 u.
        assert torch.allclose(f, expect, rtol=3 * U[torch.float64], atol=0)
        assert (f.abs() <= tails(a)[d - 1].abs() / eps * (1 + 1e-12)).all()


def test_overflow_and_non_finite_inputs_follow_the_docstring():
    cf = cemfrac.ops.continued_fraction
    huge = torch.full((4, 3), 1e30)  # continuants overflow float32, f = 1 / a_1 does not
    assert torch.allclose(cf(huge), torch.full((4,), 1e-30), rtol=1e-6)
    assert not torch.isfinite(cf(huge, impl="reference")).any()  # no slow path there
    a = torch.tensor([0.0, 1e30], requires_grad=True)  # f = 1e30, df/da_1 = -1e60: beyond float32
    cf(a).backward()
    assert cf(a.detach()).item() == pytest.approx(1e30, rel=1e-6) and a.grad[0] == -float("inf")
    x = torch.tensor([[1.0, 2.0], [float("nan"), 2.0], [3.0, 4.0]])  # a nan stays in its ladder
    out = cf(x)
    assert torch.isnan(out[1]) and torch.equal(out[[0, 2]], cf(x[[0, 2]]))
    inf = float("inf")
    assert cf(torch.tensor([[inf], [-inf]])).tolist() == [0.0, -0.0]  # d = 1: 1 / +-inf
    assert torch.isnan(cf(torch.tensor([1.0, inf]))).item()  # deeper: inf / inf


def test_empty_batch_noncontiguous_and_layouts():
    a = positive((0, 4)).requires_grad_(True)
    f = cf(a)
    assert f.shape == (0,)
    f.sum().backward()
    assert a.grad.shape == (0, 4)
    base = positive((6, 5, 8))
    # Non-contiguous: a transposed and strided view gives the values of its contiguous copy.
    view = base.transpose(0, 2)[::2]  # (4, 5, 6), strides not contiguous
    assert not view.is_contiguous()
    assert torch.equal(cf(view, dim=1), cf(view.contiguous(), dim=1))
    # dim = -2 is the kernel's (..., d, L) layout; dim = -1 the same ladders laid out (..., L, d).
    assert torch.equal(cf(base, dim=-2), cf(base.transpose(-1, -2), dim=-1))
    assert torch.equal(cf(base, dim=0), cf(base.movedim(0, -1), dim=-1))
    # Any leading shape.
    assert cf(positive((2, 3, 4, 5))).shape == (2, 3, 4)
    assert cf(positive((5,))).shape == ()


def test_float32_and_float64_agree():
    a64 = positive((200, 8), seed=3)
    a32 = a64.float()
    # Same inputs (a32 is exact in float64): the float32 result is within (4d - 1) u32 of the exact
    # value and the float64 one within (4d - 1) u64 (see the bound above).
    assert torch.allclose(cf(a32).double(), cf(a32.double()), rtol=(4 * 8 - 1) * (U[torch.float32] + U[torch.float64]), atol=0)


# ---- gradients ----------------------------------------------------------------------------------

@pytest.mark.parametrize("d", range(1, 9))
def test_gradcheck_float64(d):
    a = away_from_poles((7, d), seed=d).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: cf(x, eps=0.01), (a,))
    # The same through the native layout and a strided view.
    b = away_from_poles((3, d, 4), seed=50 + d).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: cf(x, dim=-2), (b,))
    assert torch.autograd.gradcheck(lambda x: cf(x.transpose(0, 2), dim=1), (b,))


@pytest.mark.parametrize("d", [1, 2, 4, 8])
def test_gradient_near_a_pole(d):
    eps = 0.01
    a = away_from_poles((4, d), seed=200 + d)
    k = tails(a)
    kd2 = k[d - 2] if d >= 2 else torch.zeros(4, dtype=torch.float64)
    # Rows: inside the clamp (|K_d| = eps/2, both signs), outside but near it (|K_d| = 3 eps).
    target = torch.tensor([eps / 2, -eps / 2, 3 * eps, -3 * eps], dtype=torch.float64)
    a[:, 0] = (target - kd2) / k[d - 1]
    a.requires_grad_(True)
    # Outside the clamp both backward modes are the true derivative.
    out = a[2:].detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: cf(x, eps=eps), (out,))
    # Inside it, "exact" is the derivative of the clamped map (K̂_d = ±eps constant) ...
    assert torch.autograd.gradcheck(lambda x: cf(x, eps=eps, backward="exact"), (a,))
    # ... and "surrogate" (the default) is Proposition 1 with K̂_d: df/da_k = (-1)^k (K_{d-k}/K̂_d)^2.
    (g,) = torch.autograd.grad(cf(a, eps=eps).sum(), a)
    kk = tails(a.detach())
    kh = torch.where(kk[d] >= 0, kk[d].clamp_min(eps), kk[d].clamp_max(-eps))
    expect = torch.stack([(-1.0) ** k * (kk[d - k] / kh) ** 2 for k in range(1, d + 1)], dim=-1)
    # Same continuants bitwise; each side rounds (K_{d-k} / K̂_d)^2 at most 6 times: within 12 u.
    assert torch.allclose(g, expect, rtol=12 * U[torch.float64], atol=0)


def test_backward_accumulates_and_float32_grad_dtype():
    a = positive((10, 3), torch.float32).requires_grad_(True)
    cf(a).sum().backward()
    g1 = a.grad.clone()
    cf(a).sum().backward()
    assert a.grad.dtype == torch.float32
    assert torch.equal(a.grad, 2 * g1)


# ---- errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, message", [
    (lambda: cf(torch.ones(3, 4, dtype=torch.int64)),
     "continued_fraction: a must be floating point (float32 or float64), got Long"),
    (lambda: cf(torch.ones(3, 0)), "continued_fraction: the ladder depth a.size(-1) must be at least 1, got shape [3, 0]"),
    (lambda: cf(torch.ones(3, 4), dim=2), "continued_fraction: dim = 2 is out of range for a 2-dim tensor"),
    (lambda: cf(torch.ones(3, 4), eps=-1), "continued_fraction: eps must be finite and >= 0, got -1"),
    (lambda: cf(torch.ones(3, 4), backward="nope"), "unknown ladder backward 'nope' (expected surrogate or exact)"),
    (lambda: cf(torch.ones(3, 4), impl="nope"), "unknown ladder implementation 'nope' (expected fused, reference or literal)"),
])
def test_errors_are_one_line_cemfrac_errors(call, message):
    with pytest.raises(cemfrac.Error) as info:
        call()
    assert str(info.value) == message
    assert isinstance(info.value, ValueError)


# ---- threads ------------------------------------------------------------------------------------

def test_two_threads_at_once_give_correct_results():
    inputs = [positive((4096, 8), seed=s) for s in (1, 2)]
    expect = [cf(x) for x in inputs]
    grads = []
    for x in inputs:
        x = x.clone().requires_grad_(True)
        cf(x).sum().backward()
        grads.append(x.grad)
    errors = []
    barrier = threading.Barrier(2)

    def worker(i):
        try:
            barrier.wait()
            for _ in range(30):
                x = inputs[i].clone().requires_grad_(True)
                f = cf(x)
                f.sum().backward()
                if not (torch.equal(f, expect[i]) and torch.equal(x.grad, grads[i])):
                    errors.append(f"thread {i}: result differs")
        except Exception as e:  # noqa: BLE001
            errors.append(f"thread {i}: {e!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
