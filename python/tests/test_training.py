"""A 30-step AdamW loop on a tiny model built from cemfrac layers lowers the loss, and the same loop
written in C++ (torch::optim::AdamW, same initial tensors, same data) gives the same losses.

Tolerance: zero (bitwise equal). Both loops run in this process on the same tensors with the same
LibTorch, the same thread count and the same sequence of ATen operations: the forward and backward
are the same C++ code (the Python module only hands the tensors over), the loss is the same
cross_entropy_loss, and the Python update below performs the operations of torch::optim::AdamW in the
same order with the same double-precision scalars (bias corrections by pow, step size lr / bc1,
denominator sqrt(v) / sqrt(bc2) + eps). Nothing in either depends on the CPU's vector width
differently from the other, so equality holds on any CPU.

torch.optim.AdamW (foreach=False, its single-tensor loop) is that update on torch 1.x. From torch 2.0
its first moment is exp_avg.lerp_(grad, 1 - beta1) instead of exp_avg.mul_(beta1).add_(grad,
1 - beta1): the same value in exact arithmetic, rounded differently (measured on 2.6: the losses
agree for two steps, while exp_avg starts at zero, and differ in the last bits from the third), and
its sqrt(bc2) is bc2 ** 0.5. The second test pins that down: torch.optim.AdamW equals the Python
update written with the ops of the running torch's version, bitwise, on 1.13 and on 2.6.
"""
import json
import math

import torch
import torch.nn.functional as F

from _support import cemfrac

V, D = 11, 16
OPTIONS = dict(d_model=D, n_heads=2, d_ff=24, context=6)
STEPS, LR, WD = 30, 1e-2, 0.01
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8  # torch::optim::AdamW's and torch.optim.AdamW's defaults
TORCH2 = int(torch.__version__.split(".")[0]) >= 2


class Tiny(torch.nn.Module):
    """Embedding E, one cemfrac mixer and one cemfrac FFN with residuals, head tied to E."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.mixer = cemfrac.layers.CemAttention(**OPTIONS, steps=2)
        self.ffn = cemfrac.layers.Cffn(**OPTIONS, ladders=3, depth=3)
        self.embedding = torch.nn.Parameter(torch.randn(V, D) * 0.5)

    def forward(self, tokens):
        # The ops of the C++ loop, one for one.
        z = self.embedding.index_select(0, tokens.reshape(-1)).view(tokens.shape[0], tokens.shape[1], -1)
        z = z + self.mixer(z)
        z = z + self.ffn(z)
        return torch.matmul(z, self.embedding.t())


class AdamW:
    """AdamW's single-tensor update, op for op: torch::optim::AdamW's order (torch2_ops=False), or
    torch.optim.AdamW's from torch 2.0 (lerp_ for the first moment, bc2 ** 0.5)."""

    def __init__(self, params, torch2_ops=False):
        self.params = list(params)
        self.torch2_ops = torch2_ops
        self.state = [{"step": 0, "m": torch.zeros_like(p), "v": torch.zeros_like(p)} for p in self.params]

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p, s in zip(self.params, self.state):
            g = p.grad
            s["step"] += 1
            p.mul_(1 - LR * WD)
            if self.torch2_ops:
                s["m"].lerp_(g, 1 - BETA1)
            else:
                s["m"].mul_(BETA1).add_(g, alpha=1 - BETA1)
            s["v"].mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
            bc1 = 1 - BETA1 ** s["step"]
            bc2 = 1 - BETA2 ** s["step"]
            bc2_sqrt = bc2 ** 0.5 if self.torch2_ops else math.sqrt(bc2)
            denom = (s["v"].sqrt() / bc2_sqrt).add_(EPS)
            p.addcdiv_(s["m"], denom, value=-(LR / bc1))


def setup():
    model = Tiny(seed=5)
    g = torch.Generator().manual_seed(6)
    tokens = torch.randint(V, (4, 6), generator=g)
    targets = torch.randint(V, (4, 6), generator=g)
    return model, tokens, targets


def train(model, opt, tokens, targets):
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model(tokens).reshape(-1, V), targets.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_adamw_loop_lowers_loss_and_equals_the_cpp_loop():
    model, tokens, targets = setup()
    state = [("embedding", model.embedding.detach().clone())]
    state += [("mixer." + k, v.detach().clone()) for k, v in model.mixer.named_parameters()]
    state += [("ffn." + k, v.detach().clone()) for k, v in model.ffn.named_parameters()]

    losses = train(model, AdamW(model.parameters()), tokens, targets)

    assert losses[-1] < losses[0] and sum(losses[-5:]) < sum(losses[:5])
    config = {"d_model": D, "n_heads": 2, "d_ff": 24, "context": 6,
              "cem": {"steps": 2}, "cofrgenet": {"ladders": 3, "depth": 3}}
    cpp = cemfrac._C._testing.reference_adamw_losses("cem_attention", "cffn", json.dumps(config), state,
                                                     tokens, targets, STEPS, LR, WD)
    assert cpp == losses  # bitwise: see the module docstring


def test_torch_optim_adamw_is_the_update_of_its_version():
    model, tokens, targets = setup()
    ours = train(model, AdamW(model.parameters(), torch2_ops=TORCH2), tokens, targets)
    model, tokens, targets = setup()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, foreach=False)
    theirs = train(model, opt, tokens, targets)
    assert theirs == ours  # bitwise: the same ops in the same order (module docstring)
