"""The fused ops as dispatcher operators: torch.ops.cemfrac.* exist once cemfrac is imported, are the
functions cemfrac.ops calls, are differentiable twice (gradcheck + gradgradcheck in float64, the
Hessian equal to a plain PyTorch ladder's), run on the meta device, and under
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


def _opcheck():
    library = getattr(torch, "library", None)
    return getattr(library, "opcheck", None)


needs_opcheck = pytest.mark.skipif(
    _opcheck() is None, reason=f"torch.library.opcheck needs PyTorch >= 2.4, this is {torch.__version__}")
needs_compile = pytest.mark.skipif(
    not hasattr(torch, "compile") or not hasattr(torch, "_dynamo"),
    reason=f"torch.compile needs PyTorch >= 2.0, this is {torch.__version__}")


def _r(*shape, seed=0, dtype=torch.float64, lo=-1.5, hi=1.5):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def op_samples(dtype):
    """(operator, args, indices of the differentiable tensor args) for every operator."""
    ang = _r(3, 2, seed=9, dtype=dtype)
    q, k, v = _r(1, 2, 3, 2, seed=1, dtype=dtype), _r(1, 1, 3, 2, seed=2, dtype=dtype), _r(1, 1, 3, 2, seed=3, dtype=dtype)
    o = torch.ops.cemfrac
    return [
        (o.continuant, (smooth((3, 4, 5), 5).to(dtype), 0.01), [0]),
        (o.continuant, (smooth((3, 4, 5), 6).to(dtype), 0.01, True, True), [0]),
        (o.rms_norm, (_r(2, 3, 4, seed=4, dtype=dtype), _r(4, seed=5, dtype=dtype), 1e-5), [0, 1]),
        (o.silu_mul, (_r(3, 5, seed=6, dtype=dtype), _r(3, 5, seed=7, dtype=dtype)), [0, 1]),
        (o.rope, (_r(2, 2, 3, 4, seed=8, dtype=dtype), ang.cos(), ang.sin(), False), [0]),
        (o.symmetric_gram, (_r(3, 4, seed=10, dtype=dtype),), [0]),
        (o.linear, (_r(3, 4, seed=11, dtype=dtype), _r(5, 4, seed=12, dtype=dtype), _r(5, seed=13, dtype=dtype)),
         [0, 1, 2]),
        (o.linear, (_r(1, 4, seed=11, dtype=dtype), _r(5, 4, seed=12, dtype=dtype), None), [0, 1]),
        (o.causal_attention, (q, k, v), [0, 1, 2]),
        (o.causal_attention_shared_bias,
         (q, k, v, _r(1, 3, 2, seed=14, dtype=dtype), _r(1, 3, 2, seed=15, dtype=dtype), _r(1, 3, 3, seed=16, dtype=dtype)),
         [0, 1, 2, 3, 4, 5]),
        (o.causal_attention_head_diag,
         (q, k, v, _r(1, 3, 2, seed=17, dtype=dtype), _r(1, 3, 2, seed=18, dtype=dtype), _r(2, 2, seed=19, dtype=dtype)),
         [0, 1, 2, 3, 4, 5]),
    ]


def _with_grad(args, diff, requires_grad):
    return tuple(a.clone().requires_grad_(requires_grad and i in diff) if isinstance(a, torch.Tensor) else a
                 for i, a in enumerate(args))


def _on_meta(args):
    return tuple(torch.empty(a.shape, dtype=a.dtype, device="meta") if isinstance(a, torch.Tensor) else a
                 for a in args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_operator_runs_on_meta_with_cpu_shapes(dtype):
    for op, args, diff in op_samples(dtype):
        cpu = op(*args)
        meta = op(*_on_meta(args))
        cpu = cpu if isinstance(cpu, (tuple, list)) else (cpu,)
        meta = meta if isinstance(meta, (tuple, list)) else (meta,)
        for c, m in zip(cpu, meta):
            assert m.device.type == "meta" and m.shape == c.shape and m.dtype == c.dtype, op


def test_every_operator_gradcheck_gradgradcheck():
    for op, args, diff in op_samples(torch.float64):
        def fn(*xs, op=op, args=args, diff=diff):
            full = list(args)
            for i, x in zip(diff, xs):
                full[i] = x
            out = op(*full)
            return out if isinstance(out, (tuple, list)) else (out,)
        xs = tuple(args[i].clone().requires_grad_() for i in diff)
        assert torch.autograd.gradcheck(fn, xs), op
        assert torch.autograd.gradgradcheck(fn, xs), op


# opcheck's checks but test_aot_dispatch_dynamic: the kernels (and their Meta kernels) read sizes as
# integers (Tensor::sizes(), numel()), which symbolic shapes refuse, so torch.compile(dynamic=True) is
# not supported (docs/python.md); static shapes are what the engine and a torch.compile(dynamic=False)
# trace give. The dynamic check is not run: an xfail(strict=False) of it could never fail.
STATIC_CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_static")


@needs_opcheck
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck_every_operator(requires_grad, dtype):
    for op, args, diff in op_samples(dtype):
        _opcheck()(op.default, _with_grad(args, diff, requires_grad), test_utils=STATIC_CHECKS)
        _opcheck()(op.default, _on_meta(args), test_utils=STATIC_CHECKS)
    a = smooth((3, 4, 5), 7).to(dtype)
    _opcheck()(torch.ops.cemfrac.continuant_forward.default, (a, 0.01, True), test_utils=STATIC_CHECKS)


# A CoFrGeNet FFN and a tied causal attention written with the operators, as the C++ layers compose
# them (layers/cofrgenet/cffn.cpp, layers/cem/cem_attention.cpp): what torch.compile sees when Python
# code calls torch.ops.cemfrac.*.
def ffn_of_ops(x, w_in, w_out, norm_w):
    h = torch.ops.cemfrac.rms_norm(x, norm_w, 1e-5)
    a = torch.ops.cemfrac.linear(h, w_in, None)                        # (B, N, d L)
    a = a.view(*a.shape[:-1], 3, -1)                                    # (B, N, d, L) ladders
    f = torch.ops.cemfrac.continuant(a.contiguous(), 0.01)             # (B, N, L)
    g = torch.ops.cemfrac.silu_mul(f, f)
    return torch.ops.cemfrac.linear(g, w_out, None)


def attention_of_ops(x, w_q, w_k, cos, sin):
    B, N, D = x.shape
    q = torch.ops.cemfrac.linear(x, w_q, None).view(B, N, 2, D // 2).transpose(1, 2)
    k = torch.ops.cemfrac.linear(x, w_k, None).view(B, N, 2, D // 2).transpose(1, 2)
    q = torch.ops.cemfrac.rope(q.contiguous(), cos, sin, False)
    k = torch.ops.cemfrac.rope(k.contiguous(), cos, sin, False)
    out = torch.ops.cemfrac.causal_attention(q, k, k)                  # (B, N, H, d_h), tied
    return out.reshape(B, N, D)


def _compile_inputs():
    x = _r(2, 5, 8, seed=20, dtype=torch.float32)
    ffn = (x, _r(3 * 4, 8, seed=21, dtype=torch.float32, lo=0.5, hi=1.0), _r(8, 4, seed=22, dtype=torch.float32),
           _r(8, seed=23, dtype=torch.float32, lo=0.5, hi=1.5))
    ang = torch.outer(torch.arange(5, dtype=torch.float32), torch.tensor([1.0, 0.1]))
    attn = (x, _r(8, 8, seed=24, dtype=torch.float32), _r(8, 8, seed=25, dtype=torch.float32), ang.cos(), ang.sin())
    return [(ffn_of_ops, ffn), (attention_of_ops, attn)]


@needs_compile
def test_dynamo_sees_no_graph_break_in_the_operators():
    for fn, args in _compile_inputs():
        explanation = torch._dynamo.explain(fn)(*args)
        assert explanation.graph_break_count == 0, (fn.__name__, explanation.break_reasons)


@needs_compile
def test_compile_equals_eager_within_float32_bound():
    for fn, args in _compile_inputs():
        torch._dynamo.reset()
        eager = fn(*args)
        compiled = torch.compile(fn, backend="inductor")(*args)
        # Inductor runs the same operator kernels (it cannot fuse into opaque custom ops) and may
        # reorder only the ATen glue (views, a contiguous copy): each output is the same sequence of
        # float32 roundings, up to a reassociated sum. Bound: 64 u |y|_max, u = 2^-24, for
        # reductions over at most 16 terms (rms over 8, linear over 8/12), two layers of them.
        bound = 64 * 2.0 ** -24 * eager.abs().max().item()
        assert (compiled - eager).abs().max().item() <= bound, fn.__name__
