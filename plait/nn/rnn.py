"""GRU and LSTM (multi-layer, bidirectional, batch_first) with torch.nn's parameter names and gate order.

The input projection of every time step is one matmul per layer and direction; the recurrence is unrolled over
time into plait ops, so forward and backward through time compile like any other graph.
"""

from __future__ import annotations

import math

from plait.errors import PlaitError, ShapeError
from plait.frontends.native.tensor import Tensor, cat, stack
from plait.nn import functional as F
from plait.nn import init
from plait.nn.module import Module, Parameter


class _RNNBase(Module):
    _gates = 1

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: str | None = None,
    ):
        super().__init__()
        if num_layers < 1 or hidden_size < 1:
            raise PlaitError(f"{type(self).__name__}: num_layers and hidden_size must be positive")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout, self.bidirectional = bias, batch_first, dropout, bidirectional
        dirs = 2 if bidirectional else 1
        bound = 1.0 / math.sqrt(hidden_size)
        g = self._gates * hidden_size
        for layer in range(num_layers):
            for d in range(dirs):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                isz = input_size if layer == 0 else hidden_size * dirs
                setattr(self, "weight_ih" + sfx, Parameter(init.uniform((g, isz), bound), device=device))
                setattr(self, "weight_hh" + sfx, Parameter(init.uniform((g, hidden_size), bound), device=device))
                if bias:
                    setattr(self, "bias_ih" + sfx, Parameter(init.uniform((g,), bound), device=device))
                    setattr(self, "bias_hh" + sfx, Parameter(init.uniform((g,), bound), device=device))

    def _weights(self, layer: int, d: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        sfx = f"_l{layer}" + ("_reverse" if d else "")
        p = self._parameters
        return p["weight_ih" + sfx], p["weight_hh" + sfx], p.get("bias_ih" + sfx), p.get("bias_hh" + sfx)  # type: ignore[return-value]

    def _prepare(self, x: Tensor) -> tuple[Tensor, bool]:
        """(time-major (T, B, I) input, whether the input had no batch axis)."""
        if x.ndim not in (2, 3):
            raise ShapeError(f"{type(self).__name__}: expected a 2-d or 3-d input, got shape {x.shape}")
        unbatched = x.ndim == 2
        if unbatched:
            x = x.unsqueeze(1)
        elif self.batch_first:
            x = x.permute(1, 0, 2)
        if x.shape[2] != self.input_size:
            raise ShapeError(f"{type(self).__name__}: input feature size {x.shape[2]} != input_size={self.input_size}")
        return x, unbatched

    def _initial(self, h0: Tensor | None, batch: int, x: Tensor, unbatched: bool, what: str) -> list[Tensor]:
        dirs = 2 if self.bidirectional else 1
        if h0 is None:
            return [Tensor.zeros(batch, self.hidden_size, dtype=x.dtype, device=x.device)] * (self.num_layers * dirs)
        h = h0.unsqueeze(1) if unbatched else h0
        want = (self.num_layers * dirs, batch, self.hidden_size)
        if tuple(h.shape) != want:
            raise ShapeError(f"{type(self).__name__}: {what} has shape {h0.shape}, expected {want}")
        return [h[i] for i in range(want[0])]

    def _run(self, x: Tensor, states: list[list[Tensor]]) -> tuple[Tensor, list[list[Tensor]]]:
        """Run every layer and direction; `states[k]` holds the initial state tensors of layer/direction k."""
        dirs = 2 if self.bidirectional else 1
        t_len, batch = x.shape[0], x.shape[1]
        finals: list[list[Tensor]] = []
        for layer in range(self.num_layers):
            outs = []
            for d in range(dirs):
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, d)
                gi = F.linear(x.reshape(t_len * batch, x.shape[2]), w_ih, b_ih).reshape(t_len, batch, -1)
                state = states[layer * dirs + d]
                seq: list[Tensor] = [x] * t_len  # placeholders, overwritten in time order below
                steps = range(t_len - 1, -1, -1) if d else range(t_len)
                for t in steps:
                    gh = F.linear(state[0], w_hh, b_hh)
                    state = self._cell(gi[t], gh, state)
                    seq[t] = state[0]
                outs.append(stack(seq, 0))
                finals.append(state)
            x = cat(outs, 2) if dirs == 2 else outs[0]
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, True)
        return x, finals

    def _cell(self, gi: Tensor, gh: Tensor, state: list[Tensor]) -> list[Tensor]:
        raise NotImplementedError

    def _output(self, out: Tensor, unbatched: bool) -> Tensor:
        if unbatched:
            return out.squeeze(1)
        return out.permute(1, 0, 2) if self.batch_first else out

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, bidirectional={self.bidirectional}"
        )


class GRU(_RNNBase):
    """torch.nn.GRU: gates (r, z, n); h' = (1 - z) * n + z * h with n = tanh(W_in x + b_in + r * (W_hn h + b_hn))."""

    _gates = 3

    def forward(self, x: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        xt, unbatched = self._prepare(x)
        h0 = self._initial(hx, xt.shape[1], xt, unbatched, "hx")
        out, finals = self._run(xt, [[h] for h in h0])
        h_n = stack([s[0] for s in finals], 0)
        return self._output(out, unbatched), (h_n.squeeze(1) if unbatched else h_n)

    def _cell(self, gi: Tensor, gh: Tensor, state: list[Tensor]) -> list[Tensor]:
        h = state[0]
        hs = self.hidden_size
        ir, iz, inn = gi[:, :hs], gi[:, hs : 2 * hs], gi[:, 2 * hs :]
        hr, hz, hn = gh[:, :hs], gh[:, hs : 2 * hs], gh[:, 2 * hs :]
        r = (ir + hr).sigmoid()
        z = (iz + hz).sigmoid()
        n = (inn + r * hn).tanh()
        return [n + z * (h - n)]


class LSTM(_RNNBase):
    """torch.nn.LSTM: gates (i, f, g, o); c' = f * c + i * g, h' = o * tanh(c')."""

    _gates = 4

    def forward(self, x: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        xt, unbatched = self._prepare(x)
        batch = xt.shape[1]
        h0 = self._initial(hx[0] if hx else None, batch, xt, unbatched, "h_0")
        c0 = self._initial(hx[1] if hx else None, batch, xt, unbatched, "c_0")
        out, finals = self._run(xt, [[h, c] for h, c in zip(h0, c0, strict=True)])
        h_n, c_n = stack([s[0] for s in finals], 0), stack([s[1] for s in finals], 0)
        if unbatched:
            h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
        return self._output(out, unbatched), (h_n, c_n)

    def _cell(self, gi: Tensor, gh: Tensor, state: list[Tensor]) -> list[Tensor]:
        c = state[1]
        hs = self.hidden_size
        a = gi + gh
        i, f = a[:, :hs].sigmoid(), a[:, hs : 2 * hs].sigmoid()
        g, o = a[:, 2 * hs : 3 * hs].tanh(), a[:, 3 * hs :].sigmoid()
        c2 = f * c + i * g
        return [o * c2.tanh(), c2]
