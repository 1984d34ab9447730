"""The device as data from Python: every layer class and a model follow
.to("meta") and run forward and backward there (shapes only); inputs or ids on another device than
the module's are a clear error, never read through the wrong pointer; cemfrac.load(device=)."""
import pytest
import torch

from _support import cemfrac

from cemfrac._cpp_module import check_tensor_identity

KINDS = cemfrac.layers.kinds()
TINY_MODEL = dict(vocab_size=11, d_model=16, n_layers=2, n_heads=2, d_ff=24, context=8)


@pytest.mark.parametrize("family, kind, name", KINDS, ids=[k for _, k, _ in KINDS])
def test_every_kind_runs_forward_and_backward_on_meta(family, kind, name):
    # The reproduction: before, all 10 kinds failed here (invalid gradient device, set_data
    # incompatible, or a meta / cpu mismatch inside the C++ forward).
    layer = cemfrac.layers.make(kind, d_model=64, n_heads=4).to("meta")
    assert check_tensor_identity(layer)  # the Python parameters are the C++ module's again
    assert all(p.is_meta for p in layer.parameters())
    assert all(b.is_meta for b in layer.buffers())
    x = torch.randn(2, 5, 64, device="meta", requires_grad=True)
    y = layer(x)
    assert y.is_meta and y.shape == x.shape
    y.sum().backward()
    assert x.grad is not None and x.grad.is_meta
    for pname, p in layer.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.is_meta and p.grad.shape == p.shape, pname


@pytest.mark.parametrize("family, kind, name", KINDS, ids=[k for _, k, _ in KINDS])
def test_meta_keeps_dtype_and_the_state_dict_keys(family, kind, name):
    layer = cemfrac.layers.make(kind, d_model=16, n_heads=2).double()
    keys = set(layer.state_dict())
    layer.to("meta")
    assert set(layer.state_dict()) == keys  # masks follow from the config: buffers, not state
    assert all(p.dtype == torch.float64 for p in layer.parameters())
    assert layer(torch.zeros(1, 3, 16, dtype=torch.float64, device="meta")).is_meta


@pytest.mark.parametrize("family, kind, name", KINDS, ids=[k for _, k, _ in KINDS])
def test_input_on_another_device_is_an_error(family, kind, name):
    layer = cemfrac.layers.make(kind, d_model=16, n_heads=2)
    with pytest.raises(cemfrac.Error, match="input is on meta but the layer is on cpu"):
        layer(torch.zeros(1, 3, 16, device="meta"))
    layer.to("meta")
    with pytest.raises(cemfrac.Error, match="input is on cpu but the layer is on meta"):
        layer(torch.zeros(1, 3, 16))


def test_model_on_meta_and_ids_on_another_device():
    torch.manual_seed(0)
    model = cemfrac.Model.from_config(TINY_MODEL)
    ids = torch.tensor([[1, 2, 3, 4]])
    # Meta ids on a CPU model gave finite, made-up logits.
    with pytest.raises(cemfrac.Error, match="model input is on meta but the model is on cpu"):
        model(ids.to("meta"))
    model.to("meta")
    assert all(p.is_meta for p in model.parameters()) and check_tensor_identity(model)
    logits = model(ids.to("meta"))
    assert logits.is_meta and logits.shape == (1, 4, 11)
    logits.sum().backward()
    assert all(p.grad is not None and p.grad.is_meta for p in model.parameters() if p.requires_grad)
    with pytest.raises(cemfrac.Error, match="model input is on cpu but the model is on meta"):
        model(ids)


def test_meta_to_cpu_is_refused_as_torch_refuses_it():
    layer = cemfrac.layers.make("mha", d_model=16, n_heads=2).to("meta")
    with pytest.raises(NotImplementedError):
        layer.to("cpu")


def test_device_names_are_checked():
    with pytest.raises(cemfrac.Error, match="unknown device"):
        cemfrac._C.Model.load("/nonexistent", [], "tpu")
    if not torch.cuda.is_available():
        with pytest.raises(cemfrac.Error, match="no CUDA"):
            cemfrac._C.Model.load("/nonexistent", [], "cuda")


def test_load_on_meta_checks_shapes_of_a_cpu_checkpoint(tmp_path):
    import os
    import random
    import subprocess
    from _support import CEMFRAC_EXE, ROOT
    if not os.path.exists(CEMFRAC_EXE):
        pytest.skip(f"no {CEMFRAC_EXE}")

    def cli(*args):
        r = subprocess.run([CEMFRAC_EXE, "--threads", "1", *args], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr

    docs = tmp_path / "docs"
    docs.mkdir()
    rng = random.Random(0)
    for i in range(12):
        (docs / f"d{i}.txt").write_text(" ".join(rng.choice("ab cd ef gh".split()) for _ in range(80)))
    cli("prepare", "--text", str(docs), "--tokenizer", "byte", "--out", str(tmp_path / "data"))
    run = tmp_path / "run"
    cli("train", "--config", os.path.join(ROOT, "configs", "tiny-llama.toml"),
        "--set", f"data.path={tmp_path / 'data'}", "--set", f"train.out={run}", "--set", "train.steps=1",
        "--set", "train.micro_batch=1", "--set", "train.eval_every=0", "--set", "train.warmup_steps=1",
        "--set", "model.context=16", "--set", "model.vocab_size=260")
    cpu = cemfrac.load(run)
    meta = cemfrac.load(run, device="meta")
    assert all(p.is_meta for p in meta.parameters())
    assert {k: v.shape for k, v in meta.named_parameters()} == {k: v.shape for k, v in cpu.named_parameters()}
    assert meta(torch.zeros(1, 4, dtype=torch.int64, device="meta")).shape == (1, 4, 260)
    with pytest.raises(cemfrac.Error, match="unknown device"):
        cemfrac.load(run, device="gpu")
