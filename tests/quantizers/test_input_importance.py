"""Each linear's mean squared input per column, taken without forming the Hessian: the same
statistic as the diagonal of GPTQ's Hessian over two, over the real tokens only, shared by
linears that read one input tensor, from any pass run while watching."""

from __future__ import annotations

import torch
from torch import nn

from quantkit.quantizers.gptq.collect import collect_hessians
from quantkit.quantizers.importance import ColumnImportance, input_importance


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.q_proj, self.k_proj, self.o_proj = nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(8, 8)
        for m in (self.q_proj, self.k_proj, self.o_proj):
            m.weight.data = torch.randn(m.weight.shape, generator=g)

    def forward(self, x):
        q, k = self.q_proj(x), self.k_proj(x)
        return self.o_proj(torch.relu(q)) + k.sum()


class Ctx:
    """The parts of a LayerContext the statistics read: two batches, the second's last two
    positions padding (a large value there would show if they were counted)."""

    name = "layer"
    num_batches = 2

    def __init__(self, layer: Attn):
        self.layer = layer
        self.targets = {n: (getattr(layer, n), None) for n in ("q_proj", "k_proj", "o_proj")}
        g = torch.Generator().manual_seed(1)
        self.inputs = [torch.randn(2, 5, 8, generator=g), torch.randn(1, 5, 8, generator=g)]
        self.inputs[1][0, 3:] = 100.0
        self.valid = [torch.ones(2, 5, dtype=torch.bool), torch.tensor([[True, True, True, False, False]])]
        self._batch = 0

    def tokens(self, x):
        return x[self.valid[self._batch]]

    def forward(self):
        for j, x in enumerate(self.inputs):
            self._batch = j
            self.layer(x)


def test_mean_squared_input_equals_the_hessian_diagonal_over_two():
    ctx = Ctx(Attn())
    names = list(ctx.targets)
    got = input_importance(ctx, names)
    hs = collect_hessians(ctx, names)
    for name in names:
        H = hs.H[hs.leader[name]]
        torch.testing.assert_close(got[name], torch.diagonal(H) / 2, rtol=1e-5, atol=1e-6)
    # q and k read the same tensor: one statistic; o reads its own
    assert torch.equal(got["q_proj"], got["k_proj"]) and not torch.equal(got["q_proj"], got["o_proj"])
    real = torch.cat([x[v] for x, v in zip(ctx.inputs, ctx.valid)])
    torch.testing.assert_close(got["q_proj"], real.pow(2).mean(0))
    assert float(got["q_proj"].max()) < 100.0      # the padding's 100s left out


def test_watching_counts_only_the_passes_inside():
    ctx = Ctx(Attn())
    imp = ColumnImportance(ctx, ["q_proj"])
    with imp.watching():
        ctx.forward()
    ctx.forward()                                   # after leaving: not counted
    assert imp.tokens["q_proj"] == 2 * 5 + 3
    torch.testing.assert_close(imp.result()["q_proj"], input_importance(ctx, ["q_proj"])["q_proj"])
