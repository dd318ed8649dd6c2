"""Recurrent ONNX ops: RNN, GRU, LSTM, unrolled over the (static) sequence length.

The input projection X @ W^T of every time step is one GEMM; each step then adds H @ R^T and applies the gates.
Directions forward, reverse and bidirectional; layout 0 and 1; activations, clip, GRU's linear_before_reset and
LSTM peepholes are supported. Variable sequence lengths are supported only when every length is the full length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from plait.frontends.native.tensor import Tensor, stack, where
from plait.onnx.importer import Ctx
from plait.onnx.ops import register

Act = Callable[[Tensor], Tensor]


def _activation(ctx: Ctx, name: str, alpha: float | None, beta: float | None) -> Act:
    n = name.lower()
    if n == "tanh":
        return lambda x: x.tanh()
    if n == "sigmoid":
        return lambda x: x.sigmoid()
    if n == "relu":
        return lambda x: x.relu()
    if n == "affine":
        return lambda x: x * (alpha if alpha is not None else 1.0) + (beta or 0.0)
    if n == "leakyrelu":
        return lambda x: where(x >= 0, x, x * (alpha if alpha is not None else 0.01))
    if n == "thresholdedrelu":
        return lambda x: where(x > (alpha if alpha is not None else 1.0), x, 0.0)
    if n == "scaledtanh":
        return lambda x: (x * (beta if beta is not None else 1.0)).tanh() * (alpha if alpha is not None else 1.0)
    if n == "hardsigmoid":
        return lambda x: (x * (alpha if alpha is not None else 0.2) + (beta if beta is not None else 0.5)).clip(
            0.0, 1.0
        )
    if n == "elu":
        return lambda x: where(x > 0, x, (x.exp() - 1.0) * (alpha if alpha is not None else 1.0))
    if n == "softsign":
        return lambda x: x / (1.0 + x.abs())
    if n == "softplus":
        return lambda x: (x.exp() + 1.0).log()
    raise ctx.unsupported(f"recurrent activation {name!r}")


def _activations(ctx: Ctx, defaults: list[str], dirs: int) -> list[list[Act]]:
    names = list(ctx.attr("activations", defaults * dirs))
    if len(names) == len(defaults):
        names = names * dirs
    alphas = list(ctx.attr("activation_alpha", []))
    betas = list(ctx.attr("activation_beta", []))
    acts = [
        _activation(ctx, nm, alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None)
        for i, nm in enumerate(names)
    ]
    k = len(defaults)
    return [acts[d * k : (d + 1) * k] for d in range(dirs)]


def _common(ctx: Ctx, ins: list[Any], gates: int) -> dict[str, Any]:
    x = ctx.t(ins[0])
    layout = int(ctx.attr("layout", 0))
    if layout:
        x = x.permute(1, 0, 2)
    seq, batch, _ = x.shape
    w, r = ctx.t(ins[1]), ctx.t(ins[2])
    dirs = w.shape[0]
    hidden = int(ctx.attr("hidden_size", r.shape[-1]))
    b = ins[3] if len(ins) > 3 and ins[3] is not None else None
    if len(ins) > 4 and ins[4] is not None:
        lens = ctx.host(ins[4], "sequence_lens")
        if np.any(lens != seq):
            raise ctx.unsupported("sequence_lens shorter than the sequence are not supported (pad and mask instead)")
    h0 = ctx.t(ins[5]) if len(ins) > 5 and ins[5] is not None else None
    if h0 is not None and layout:
        h0 = h0.permute(1, 0, 2)
    clip = ctx.attr("clip")
    return {
        "x": x,
        "w": w,
        "r": r,
        "b": b,
        "h0": h0,
        "seq": seq,
        "batch": batch,
        "dirs": dirs,
        "hidden": hidden,
        "layout": layout,
        "gates": gates,
        "clip": clip,
    }


def _proj(ctx: Ctx, c: dict[str, Any], d: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(X W^T + Wb) for every step (seq, batch, G*h), R^T, Rb, and the initial hidden state of direction d."""
    g, h = c["gates"], c["hidden"]
    x, w, r = c["x"], c["w"][d], c["r"][d]
    seq, batch = c["seq"], c["batch"]
    xw = (x.reshape(seq * batch, -1) @ w.T).reshape(seq, batch, g * h)
    if c["b"] is not None:
        bb = ctx.t(c["b"])[d]
        wb, rb = bb[: g * h], bb[g * h :]
        xw = xw + wb
    else:
        rb = Tensor.zeros(g * h, device=x.device)
    h0 = c["h0"][d] if c["h0"] is not None else Tensor.zeros(batch, h, device=x.device)
    return xw, r.T, rb, h0


def _clip(c: dict[str, Any], t: Tensor) -> Tensor:
    return t.clip(-float(c["clip"]), float(c["clip"])) if c["clip"] is not None else t


def _outputs(c: dict[str, Any], per_dir: list[list[Tensor]], finals: list[list[Tensor]]) -> list[Tensor]:
    y = stack([stack(steps, 0) for steps in per_dir], 1)  # (seq, dirs, batch, h)
    states = [stack([f[i] for f in finals], 0) for i in range(len(finals[0]))]  # each (dirs, batch, h)
    if c["layout"]:
        y = y.permute(2, 0, 1, 3)
        states = [s.permute(1, 0, 2) for s in states]
    return [y, *states]


def _steps(c: dict[str, Any], d: int, direction: str) -> list[int]:
    rev = direction == "reverse" or (direction == "bidirectional" and d == 1)
    order = list(range(c["seq"]))
    return order[::-1] if rev else order


def _rnn(ctx: Ctx, ins: list[Any]) -> list[Tensor]:
    c = _common(ctx, ins, 1)
    direction = ctx.attr("direction", "forward")
    acts = _activations(ctx, ["Tanh"], c["dirs"])
    per_dir, finals = [], []
    for d in range(c["dirs"]):
        xw, rt, rb, h = _proj(ctx, c, d)
        outs: dict[int, Tensor] = {}
        for t in _steps(c, d, direction):
            h = acts[d][0](_clip(c, xw[t] + h @ rt + rb))
            outs[t] = h
        per_dir.append([outs[t] for t in range(c["seq"])])
        finals.append([h])
    return _outputs(c, per_dir, finals)


def _gru(ctx: Ctx, ins: list[Any]) -> list[Tensor]:
    c = _common(ctx, ins, 3)
    direction = ctx.attr("direction", "forward")
    acts = _activations(ctx, ["Sigmoid", "Tanh"], c["dirs"])
    lbr = int(ctx.attr("linear_before_reset", 0))
    hs = c["hidden"]
    per_dir, finals = [], []
    for d in range(c["dirs"]):
        xw, rt, rb, h = _proj(ctx, c, d)
        f, g = acts[d]
        rt_zr, rt_h = rt[:, : 2 * hs], rt[:, 2 * hs :]
        rb_zr, rb_h = rb[: 2 * hs], rb[2 * hs :]
        outs: dict[int, Tensor] = {}
        for t in _steps(c, d, direction):
            x_t = xw[t]
            zr = f(_clip(c, x_t[:, : 2 * hs] + h @ rt_zr + rb_zr))
            z, r = zr[:, :hs], zr[:, hs:]
            if lbr:
                cand = g(_clip(c, x_t[:, 2 * hs :] + r * (h @ rt_h + rb_h)))
            else:
                cand = g(_clip(c, x_t[:, 2 * hs :] + (r * h) @ rt_h + rb_h))
            h = (1.0 - z) * cand + z * h
            outs[t] = h
        per_dir.append([outs[t] for t in range(c["seq"])])
        finals.append([h])
    return _outputs(c, per_dir, finals)


def _lstm(ctx: Ctx, ins: list[Any]) -> list[Tensor]:
    c = _common(ctx, ins, 4)
    if ctx.attr("input_forget", 0):
        raise ctx.unsupported("LSTM input_forget=1 is not supported")
    direction = ctx.attr("direction", "forward")
    acts = _activations(ctx, ["Sigmoid", "Tanh", "Tanh"], c["dirs"])
    hs, batch = c["hidden"], c["batch"]
    c0 = ctx.t(ins[6]) if len(ins) > 6 and ins[6] is not None else None
    if c0 is not None and c["layout"]:
        c0 = c0.permute(1, 0, 2)
    p = ctx.t(ins[7]) if len(ins) > 7 and ins[7] is not None else None
    per_dir, finals = [], []
    for d in range(c["dirs"]):
        xw, rt, rb, h = _proj(ctx, c, d)
        f, g, hh = acts[d]
        cell = c0[d] if c0 is not None else Tensor.zeros(batch, hs, device=h.device)
        pi, po, pf = (p[d][k * hs : (k + 1) * hs] for k in range(3)) if p is not None else (None, None, None)
        outs: dict[int, Tensor] = {}
        for t in _steps(c, d, direction):
            gates = xw[t] + h @ rt + rb
            gi, go, gf, gc = (gates[:, k * hs : (k + 1) * hs] for k in range(4))
            if pi is not None and pf is not None:
                gi, gf = gi + pi * cell, gf + pf * cell
            i_t, f_t, c_t = f(_clip(c, gi)), f(_clip(c, gf)), g(_clip(c, gc))
            cell = f_t * cell + i_t * c_t
            if po is not None:
                go = go + po * cell
            o_t = f(_clip(c, go))
            h = o_t * hh(cell)
            outs[t] = h
        per_dir.append([outs[t] for t in range(c["seq"])])
        finals.append([h, cell])
    return _outputs(c, per_dir, finals)


register("RNN", _rnn)
register("GRU", _gru)
register("LSTM", _lstm)
