"""A 30-step torch.optim.AdamW loop on a tiny model built from cemfrac layers lowers the loss, and the
same loop written in C++ (torch::optim::AdamW, same initial tensors, same data) gives the same losses.

Tolerance: zero (bitwise equal). Both loops run in this process on the same tensors with the same
LibTorch, the same thread count and the same sequence of ATen operations: the forward and backward
are the same C++ code (the Python module only hands the tensors over), the loss is the same
cross_entropy_loss, and torch.optim.AdamW's single-tensor update (foreach=False) performs the
operations of torch::optim::AdamW in the same order with the same double-precision scalars
(bias corrections by pow, step size lr / bc1, denominator sqrt(v) / sqrt(bc2) + eps). Nothing in
either depends on the CPU's vector width differently from the other, so equality holds on any CPU.
"""
import json

import torch
import torch.nn.functional as F

from _support import cemfrac

V, D = 11, 16
OPTIONS = dict(d_model=D, n_heads=2, d_ff=24, context=6)


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


def test_adamw_loop_lowers_loss_and_equals_the_cpp_loop():
    model = Tiny(seed=5)
    g = torch.Generator().manual_seed(6)
    tokens = torch.randint(V, (4, 6), generator=g)
    targets = torch.randint(V, (4, 6), generator=g)
    state = [("embedding", model.embedding.detach().clone())]
    state += [("mixer." + k, v.detach().clone()) for k, v in model.mixer.named_parameters()]
    state += [("ffn." + k, v.detach().clone()) for k, v in model.ffn.named_parameters()]

    steps, lr, wd = 30, 1e-2, 0.01
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd, foreach=False)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(tokens).reshape(-1, V), targets.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())

    assert losses[-1] < losses[0] and sum(losses[-5:]) < sum(losses[:5])
    config = {"d_model": D, "n_heads": 2, "d_ff": 24, "context": 6,
              "cem": {"steps": 2}, "cofrgenet": {"ladders": 3, "depth": 3}}
    cpp = cemfrac._C._testing.reference_adamw_losses("cem_attention", "cffn", json.dumps(config), state,
                                                     tokens, targets, steps, lr, wd)
    assert cpp == losses  # bitwise: see the module docstring
