"""Every mixer and FFN kind of cemfrac's registry as a torch.nn.Module class, generated at import.

    cemfrac.layers.Cffn(d_model=256, ladders=3, depth=5)          # FFN:   x (B, N, D) -> (B, N, D)
    cemfrac.layers.CemAttention(d_model=256, n_heads=4, steps=2, dlr="shared")   # mixer, causal

The options are the model config's TOML/JSON field names (docs/formats.md, `cemfrac train --help`),
generated from the C++ declaration of each field (ModelConfig::visit_fields): the top-level layer
fields (d_model, n_heads, d_ff, context, positions, bias, init_std, ...) and, flattened, the fields
of the kind's family: [model.cem] for cem_* kinds, [model.cofrgenet] for the CoFrGeNet kinds and
their baselines. An option left out keeps the config's default; the layer is built exactly as layer 0
of a model with that config (same initialisation from torch's default generator: torch.manual_seed
makes it reproducible). Parameter names equal the checkpoint keys after "blocks.<l>.attn." /
"blocks.<l>.mlp." (docs/formats.md).

kinds() lists (family, kind, class name); make(kind, **options) builds one by its config name.
"""
import inspect
import json
import math
from collections import namedtuple

import torch

from . import _C
from ._cpp_module import CppModule

# Top-level ModelConfig fields that describe the whole model, not one layer.
_MODEL_ONLY = {"vocab_size", "mixer", "ffn", "layer_overrides", "norm", "norm_eps", "tie_embeddings"}
# The config group (a nested ModelConfig field) whose fields a kind's options include.
_FAMILY_GROUP = {
    "cem_attention": "cem", "cem_mlp": "cem",
    "cffn": "cofrgenet", "cattn_u": "cofrgenet", "cattn_m": "cofrgenet",
    "synthesizer_dense": "cofrgenet", "sparse_attention": "cofrgenet",
}
_GROUPS = set(_FAMILY_GROUP.values())

Option = namedtuple("Option", "name path type default help")

_DEFAULTS = json.loads(_C.default_model_config())


def _default(path):
    value = _DEFAULTS
    for part in path.split("."):
        value = value[part]
    return value


def _all_fields():
    return [(path, type_, help_) for path, type_, help_ in _C.model_config_fields()]


def options_of(kind: str):
    """The options of a kind: Option(name, path, type, default, help), in declaration order."""
    fields = _all_fields()
    top = [f for f in fields if "." not in f[0] and f[0] not in _MODEL_ONLY and f[0] not in _GROUPS]
    group = _FAMILY_GROUP.get(kind)
    nested = [f for f in fields if group and f[0].startswith(group + ".") and f[0].count(".") == 1]
    top_names = {f[0] for f in top}
    options = [Option(p, p, t, _default(p), h) for p, t, h in top]
    for p, t, h in nested:
        leaf = p.split(".", 1)[1]
        name = leaf if leaf not in top_names else p.replace(".", "_")  # a clash keeps both usable
        options.append(Option(name, p, t, _default(p), h))
    return options


def _class_name(kind: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in kind.split("_"))


def _options_doc(options):
    lines = []
    for o in options:
        lines.append(f"    {o.name} ({o.type}, default {o.default!r}; config key model.{o.path}):")
        lines.append(f"        {o.help}")
    return "\n".join(lines)


class Layer(CppModule):
    """Base of the generated layer classes."""

    kind = None      # the registry name, e.g. "cffn"
    family = None    # "mixer" or "ffn"
    options = ()     # tuple of Option

    def __init__(self, **options):
        cls = type(self)
        by_name = {o.name: o for o in cls.options}
        config = {}
        for key, value in options.items():
            o = by_name.get(key)
            if o is None:
                raise _C.Error(f"cemfrac.layers.{cls.__name__}: unknown option '{key}'; options: "
                               + ", ".join(by_name))
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            # JSON has no NaN or infinity: name the option rather than fail on the encoded text.
            if isinstance(value, float) and not math.isfinite(value):
                raise _C.Error(f"cemfrac.layers.{cls.__name__}: option '{key}' = {value}: must be a "
                               "finite number")
            node = config
            *parents, leaf = o.path.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        # The engine checks cem.precond_rank <= d_model for every model, CEM layers or not; a layer of
        # another family must not fail on a field it has no option for, so it gets a rank that fits.
        if _FAMILY_GROUP.get(cls.kind) != "cem":
            d_model = config.get("d_model", _default("d_model"))
            if isinstance(d_model, int) and 1 <= d_model < _default("cem.precond_rank"):
                config["cem"] = {"precond_rank": d_model}
        handle = _C.Layer(cls.family, cls.kind, json.dumps(config), f"cemfrac.layers.{cls.__name__}")
        super().__init__(handle)
        self._given = dict(options)

    @property
    def config(self) -> dict:
        """The full model config the layer was built from (every field, as in config.json)."""
        return json.loads(self._cpp.config_json())

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self._given.items())


class Mixer(Layer):
    """A token mixer: forward(x, offset=0) with x (B, N, D) -> (B, N, D), causal; x holds positions
    offset..offset+N-1 (RoPE and positional kinds use them), offset + N <= context."""

    family = "mixer"

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return self._cpp.forward(x, int(offset))


class Ffn(Layer):
    """A position-wise FFN: forward(x) with x (B, N, D) -> (B, N, D)."""

    family = "ffn"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._cpp.forward(x, 0)


def _make_class(family, kind):
    base = Mixer if family == "mixer" else Ffn
    options = tuple(options_of(kind))
    name = _class_name(kind)
    role = "Token mixer" if family == "mixer" else "FFN"
    doc = (f"{role} kind '{kind}' (model.{family} = \"{kind}\"), a torch.nn.Module.\n\n"
           f"{base.__doc__}\n\nOptions (keyword only; the model config's fields):\n{_options_doc(options)}\n")

    def __init__(self, **opts):
        Layer.__init__(self, **opts)

    __init__.__doc__ = doc
    __init__.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default) for o in options])
    cls = type(name, (base,), {"__init__": __init__, "__doc__": doc, "__module__": __name__,
                               "kind": kind, "options": options})
    __init__.__qualname__ = f"{name}.__init__"
    return cls


_KINDS = []
for _family, _names in (("mixer", _C.mixer_kinds()), ("ffn", _C.ffn_kinds())):
    for _kind in _names:
        _cls = _make_class(_family, _kind)
        globals()[_cls.__name__] = _cls
        _KINDS.append((_family, _kind, _cls.__name__))


def kinds():
    """[(family, kind, class name)] of every registered mixer and FFN kind."""
    return list(_KINDS)


def make(kind: str, **options) -> Layer:
    """The layer of config name `kind` ("cffn", "cem_attention", ...)."""
    for _, k, name in _KINDS:
        if k == kind:
            return globals()[name](**options)
    raise _C.Error(f"cemfrac.layers.make: unknown kind '{kind}'; kinds: "
                   + ", ".join(k for _, k, _ in _KINDS))


__all__ = ["Ffn", "Layer", "Mixer", "kinds", "make", "options_of"] + [n for _, _, n in _KINDS]
