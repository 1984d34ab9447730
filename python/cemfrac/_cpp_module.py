"""torch.nn.Modules around cemfrac's C++ modules.

The C++ module owns its parameter tensors; the Python module registers THOSE tensors (the same
TensorImpl, not copies or views) as its nn.Parameters, under the C++ names ("precond.p" becomes
submodule "precond", parameter "p"). So the C++ forward reads exactly what an optimizer updates,
gradients accumulate where p.grad reads them, and state_dict() / load_state_dict() / .to(dtype) act on
the C++ module's tensors. What breaks this: assigning a new Parameter object to an attribute (C++ does
not see it; use load_state_dict or in-place ops), and deepcopy/pickle of the module (use state_dict).
"""
from collections import OrderedDict

import torch
from torch import nn


class _Node(nn.Module):
    """One level of the C++ module tree: the parameters and buffers under one name prefix."""

    def _apply(self, fn):
        # Buffers are converted in place (tensor.data = ...), so the C++ module keeps reading them;
        # nn.Module would replace them with new tensor objects. Parameters are already set in place.
        buffers = self._buffers
        self._buffers = OrderedDict()
        try:
            super()._apply(fn)
        finally:
            self._buffers = buffers
        for buf in buffers.values():
            if buf is not None:
                buf.data = fn(buf)
        return self

    def __deepcopy__(self, memo):
        raise TypeError(f"{type(self).__name__} wraps a C++ module and cannot be deep-copied; build a "
                        "new one and load_state_dict(old.state_dict()) into it")

    def __reduce_ex__(self, protocol):
        raise TypeError(f"{type(self).__name__} wraps a C++ module and cannot be pickled; save its "
                        "state_dict() instead")


def _node(root, path):
    node = root
    for part in path:
        child = node._modules.get(part)
        if child is None:
            child = _Node()
            node.add_module(part, child)
        node = child
    return node


def adopt(root: nn.Module, handle) -> None:
    """Registers the C++ handle's parameters and buffers on `root` (a _Node) by their C++ names."""
    for name, tensor in handle.named_parameters():
        *path, leaf = name.split(".")
        if type(tensor) is not nn.Parameter:
            # The tensor object is the C++ parameter itself; Parameter(tensor) would make a new
            # TensorImpl (a detached alias) whose .grad the C++ forward never fills.
            tensor.__class__ = nn.Parameter
        _node(root, path).register_parameter(leaf, tensor)
    saved = set(handle.state_buffer_names())
    for name, tensor in handle.named_buffers():
        *path, leaf = name.split(".")
        # Buffers that follow from the config (causal masks) move with .to() but are not state.
        _node(root, path).register_buffer(leaf, tensor, persistent=name in saved)


def _clear(node: nn.Module) -> None:
    node._parameters.clear()
    node._buffers.clear()
    node._non_persistent_buffers_set.clear()
    for child in node._modules.values():
        _clear(child)
    node._modules.clear()


class CppModule(_Node):
    """Base of the modules backed by a C++ handle (self._cpp)."""

    def __init__(self, handle):
        super().__init__()
        self._cpp = handle
        adopt(self, handle)
        nn.Module.train(self, handle.is_training())

    def _apply(self, fn):
        # Within one kind of storage (cpu <-> cuda, any dtype) tensors are converted in place
        # (_Node._apply), so the C++ module keeps reading them. To or from the meta device a tensor
        # cannot change in place: the C++ module is built again on the target device, its tensors
        # take the converted values (shapes and dtypes), and the Python module adopts them. As with
        # torch.nn.Module.to("meta"), parameters are then new objects: build optimizers after .to().
        converted = {}
        for name, t in list(self._cpp.named_parameters()) + list(self._cpp.named_buffers()):
            new = fn(t)
            if not torch._has_compatible_shallow_copy_type(t, new):
                converted[name] = (t, new)
        if not converted:
            return super()._apply(fn)
        devices = {str(new.device) for _, new in converted.values()}
        if devices != {"meta"}:
            raise RuntimeError(f"{type(self).__name__}.to(): cannot move the C++ module to "
                               f"{', '.join(sorted(devices))} (only cpu, cuda and meta are supported)")
        old = {name: t for name, t in list(self._cpp.named_parameters())
               + list(self._cpp.named_buffers())}
        self._cpp.rebuild("meta")
        with torch.no_grad():
            for name, t in list(self._cpp.named_parameters()) + list(self._cpp.named_buffers()):
                t.data = fn(old[name])
                t.requires_grad_(old[name].requires_grad)
        _clear(self)
        adopt(self, self._cpp)
        return self

    def train(self, mode: bool = True):
        super().train(mode)
        self._cpp.train(bool(mode))
        return self

    def on_train_step(self, step: int, total_steps: int, dyadic: bool = True) -> None:
        """What cemfrac's trainer calls before every optimizer step: CoFrGeNet ladders' dyadic
        unfreezing (train.dyadic) and the recording of ladder ranges for eval clipping in the last
        1 % of steps. step is 0-based; total_steps the run's length. Other kinds ignore it."""
        self._cpp.on_train_step(int(step), int(total_steps), bool(dyadic))


def check_tensor_identity(module: CppModule) -> bool:
    """True when every nn.Parameter of `module` is the C++ module's own tensor (for tests)."""
    ours = dict(module.named_parameters())
    theirs = dict(module._cpp.named_parameters())
    return ours.keys() == theirs.keys() and all(ours[k] is theirs[k] for k in ours)


__all__ = ["CppModule", "adopt", "check_tensor_identity", "torch"]
