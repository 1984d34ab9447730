"""cemfrac.layers: every registered mixer and FFN kind as a torch.nn.Module whose nn.Parameters are the
C++ module's own tensors; options generated from the config declaration; gradients; errors; help()."""
import io
import os
import pydoc
import re
import subprocess
import tempfile

import pytest
import torch

from _support import CEMFRAC_EXE, cemfrac

from cemfrac._cpp_module import check_tensor_identity

# Small enough for float64 gradchecks; two heads; context long enough for every mixer kind.
TINY = dict(d_model=16, n_heads=2, d_ff=24, context=6)
KINDS = cemfrac.layers.kinds()


def build(family, kind, seed=1, **extra):
    torch.manual_seed(seed)
    layer = cemfrac.layers.make(kind, **TINY, **extra)
    layer.double()
    with torch.no_grad():  # move zero-initialised tensors (biases, low-rank factors) off zero
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return layer


def run(layer, x):
    return layer(x)



def registered_kinds():
    """The kinds the C++ registry lists in its own error message for an unknown kind."""
    out = {}
    for family in ("mixer", "ffn"):
        with pytest.raises(cemfrac.Error) as info:
            cemfrac.Model.from_config({family: "no_such_kind"})
        out[family] = re.search(r"valid kinds: (.*)$", str(info.value)).group(1).split(", ")
    return out


def test_every_registered_kind_has_a_class():
    reg = registered_kinds()
    assert sorted((f, k) for f, k, _ in KINDS) == sorted((f, k) for f in reg for k in reg[f])
    for family, kind, name in KINDS:
        cls = getattr(cemfrac.layers, name)
        assert cls.kind == kind and cls.family == family and issubclass(cls, torch.nn.Module)
    assert cemfrac.layers.Cffn.kind == "cffn" and cemfrac.layers.CemAttention.kind == "cem_attention"


def test_options_are_generated_from_the_config_declaration():
    fields = {path: (type_, help_) for path, type_, help_ in cemfrac._C.model_config_fields()}
    defaults = cemfrac.layers._DEFAULTS
    for cls, group in ((cemfrac.layers.Cffn, "cofrgenet"), (cemfrac.layers.CemAttention, "cem")):
        paths = {o.path for o in cls.options}
        # Every field of the kind's group and the layer fields of the model are options ...
        assert {p for p in fields if p.startswith(group + ".")} <= paths
        assert {"d_model", "n_heads", "d_ff", "context", "bias", "init_std", "positions"} <= paths
        for o in cls.options:  # ... with the declaration's help text and default
            assert o.help == fields[o.path][1]
            node = defaults
            for part in o.path.split("."):
                node = node[part]
            assert o.default == node
    assert "vocab_size" not in {o.name for o in cemfrac.layers.Cffn.options}
    assert "steps" not in {o.name for o in cemfrac.layers.Cffn.options}  # a CEM field


def test_help_shows_options_with_help_text():
    text = pydoc.render_doc(cemfrac.layers.Cffn, renderer=pydoc.plaintext)
    for o in cemfrac.layers.Cffn.options:
        assert o.name in text and o.help in text
    assert "ladders" in text and "cffn: number of ladders L" in text
    sig = str(__import__("inspect").signature(cemfrac.layers.CemAttention))
    assert "steps=1" in sig and "d_model=128" in sig


@pytest.mark.parametrize("family, kind, name", KINDS, ids=[k for _, k, _ in KINDS])
def test_gradcheck_each_kind(family, kind, name):
    layer = build(family, kind)
    x = (torch.randn(2, 4, TINY["d_model"], dtype=torch.float64) * 0.5).requires_grad_(True)
    # Input gradient: the full Jacobian by finite differences (torch's default tolerances).
    assert torch.autograd.gradcheck(lambda t: run(layer, t), (x,))
    # Parameter gradients: a random direction v over every parameter; central difference of the
    # loss <out, w> against sum_p <grad_p, v_p>.
    torch.manual_seed(3)
    w = torch.randn(2, 4, TINY["d_model"], dtype=torch.float64)
    params = list(layer.parameters())
    v = [torch.randn_like(p) for p in params]
    layer.zero_grad()
    (run(layer, x.detach()) * w).sum().backward()
    assert all(p.grad is not None for p in params), "a parameter got no gradient (not the C++ tensor?)"
    analytic = sum((p.grad * vp).sum() for p, vp in zip(params, v)).item()

    def loss_at(h):
        with torch.no_grad():
            for p, vp in zip(params, v):
                p.add_(vp, alpha=h)
            out = (run(layer, x.detach()) * w).sum().item()
            for p, vp in zip(params, v):
                p.sub_(vp, alpha=h)
        return out

    h = 1e-6
    numeric = (loss_at(h) - loss_at(-h)) / (2 * h)
    assert abs(numeric - analytic) <= 1e-5 + 1e-3 * abs(analytic)  # gradcheck's default atol, rtol


@pytest.mark.parametrize("family, kind, name", KINDS, ids=[k for _, k, _ in KINDS])
def test_parameters_are_the_cpp_tensors_and_named_as_checkpoint_keys(family, kind, name):
    layer = build(family, kind)
    assert check_tensor_identity(layer)
    assert all(type(p) is torch.nn.Parameter for p in layer.parameters())
    # The same config as a whole model: the block's parameters carry these names after the prefix.
    model = cemfrac.Model.from_config(dict(TINY, vocab_size=11, **{family: kind}))
    prefix = "blocks.0.attn." if family == "mixer" else "blocks.0.mlp."
    in_model = {k[len(prefix):]: v.shape for k, v in model.named_parameters() if k.startswith(prefix)}
    assert {k: v.shape for k, v in layer.named_parameters()} == in_model
    # The state_dict holds the parameters and the buffers checkpoints save (not the causal masks,
    # which follow from the config and move with .to() only).
    assert set(layer.state_dict()) == set(in_model) | set(layer._cpp.state_buffer_names())


def test_cffn_names_from_docs_formats():
    layer = cemfrac.layers.Cffn(d_model=8, ladders=3, depth=2)
    names = [k for k, _ in layer.named_parameters()]
    assert sorted(names) == sorted(["w_gate", "w_direct", "w_ladder_1", "b_ladder_1", "w_ladder_2",
                                    "b_ladder_2", "w_out"])
    assert [k for k, _ in layer.named_buffers()] == ["z_min", "z_max"]


def test_optimizer_step_reaches_the_cpp_forward_and_state_dict_round_trips():
    torch.manual_seed(0)
    layer = cemfrac.layers.CemAttention(**TINY, steps=2, dlr="shared")
    x = torch.randn(2, 5, TINY["d_model"])
    before = layer(x).detach()
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-2)
    layer(x).pow(2).mean().backward()
    opt.step()
    after = layer(x).detach()
    assert not torch.equal(before, after)  # the C++ forward reads the updated tensors
    buf = io.BytesIO()
    torch.save(layer.state_dict(), buf)
    torch.manual_seed(99)
    other = cemfrac.layers.CemAttention(**TINY, steps=2, dlr="shared")
    assert not torch.equal(other(x), after)
    buf.seek(0)
    other.load_state_dict(torch.load(buf))
    assert torch.equal(other(x), after)


def test_dtype_conversion_train_eval_and_buffers():
    layer = cemfrac.layers.Cffn(d_model=8, ladders=2, depth=3)
    layer.double()
    assert all(t.dtype == torch.float64 for _, t in layer._cpp.named_parameters())
    assert all(t.dtype == torch.float64 for _, t in layer._cpp.named_buffers())
    assert check_tensor_identity(layer)
    assert layer(torch.randn(1, 3, 8, dtype=torch.float64)).dtype == torch.float64
    layer.eval()
    assert not layer._cpp.is_training()
    parent = torch.nn.Sequential(layer)
    parent.train()
    assert layer._cpp.is_training()


def cli_error(toml_text):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bad.toml")
        with open(path, "w") as f:
            f.write(toml_text)
        r = subprocess.run([CEMFRAC_EXE, "params", "--config", path], capture_output=True, text=True)
        assert r.returncode != 0
        return r.stderr.strip()


@pytest.mark.skipif(not os.path.exists(CEMFRAC_EXE), reason=f"no {CEMFRAC_EXE}")
def test_config_errors_are_the_engines_one_line_messages():
    with pytest.raises(cemfrac.Error) as info:
        cemfrac.layers.Cffn(d_model=16, depth=0)
    message = str(info.value)
    assert "\n" not in message and message.startswith("cemfrac.layers.Cffn: ")
    # The CLI reports the same problem of the same config in the same words.
    cli = cli_error('[model]\nd_model = 16\nffn = "cffn"\n[model.cofrgenet]\ndepth = 0\n')
    assert message[len("cemfrac.layers.Cffn: "):] in cli, (message, cli)
    with pytest.raises(cemfrac.Error) as info:
        cemfrac.layers.CemAttention(d_model=8, n_heads=3)
    assert "n_heads = 3: must divide d_model = 8" in str(info.value)
    with pytest.raises(cemfrac.Error, match=r"^cemfrac.layers.Cffn: unknown option 'ladder'; options: "):
        cemfrac.layers.Cffn(ladder=3)
    with pytest.raises(cemfrac.Error, match=r"cofrgenet.ladders = 2.5: expected an integer"):
        cemfrac.layers.Cffn(ladders=2.5)


def test_name_options_are_strings_in_and_out():
    # Fields with a fixed set of names are enums in C++; Python gives and gets their names.
    layer = cemfrac.layers.Cffn(d_model=8, gate="silu")
    assert layer.config["cofrgenet"]["gate"] == "silu"
    assert layer.config["positions"] == "rope" and layer.config["norm"] == "rmsnorm"
    assert {o.name: o.type for o in cemfrac.layers.options_of("cffn")}["gate"] == "str"
    with pytest.raises(cemfrac.Error, match=r'cofrgenet.gate = "relu": unknown; valid: sigmoid, silu$'):
        cemfrac.layers.Cffn(d_model=8, gate="relu")


def test_shape_and_dtype_errors():
    layer = cemfrac.layers.Cffn(d_model=8)
    with pytest.raises(cemfrac.Error) as info:
        layer(torch.zeros(2, 3, 5))
    assert str(info.value) == "cemfrac.layers.Cffn: input must be (batch, tokens, d_model = 8), got shape [2, 3, 5]"
    with pytest.raises(cemfrac.Error, match="input is Double but the parameters are Float"):
        layer(torch.zeros(2, 3, 8, dtype=torch.float64))
    mixer = cemfrac.layers.Mha(**TINY)
    with pytest.raises(cemfrac.Error, match="outside the layer's context of 6 tokens"):
        mixer(torch.zeros(1, 7, 16))


def test_non_finite_options_are_named():
    # JSON has no NaN: the option is named, not "options are not valid JSON".
    for value in (float("nan"), float("inf"), torch.tensor(float("nan"))):
        with pytest.raises(cemfrac.Error, match="option 'eps' = .*: must be a finite number"):
            cemfrac.layers.Cffn(d_model=8, eps=value)


def test_cem_attention_on_an_empty_batch():
    # 0 rows in, 0 rows out, as Mha (it was "cannot reshape tensor of 0 elements").
    for cls in (cemfrac.layers.CemAttention, cemfrac.layers.Mha):
        layer = cls(d_model=16, n_heads=2).double()
        x = torch.randn(0, 4, 16, dtype=torch.float64, requires_grad=True)
        y = layer(x)
        assert y.shape == x.shape, cls.__name__
        y.sum().backward()
        assert x.grad.shape == x.shape
