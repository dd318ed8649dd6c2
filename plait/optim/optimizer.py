"""Optimizers with torch.optim's update rules, hyper-parameter names and param_groups."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from plait.errors import PlaitError
from plait.frontends.native.tensor import Tensor
from plait.graph.autodiff import no_grad
from plait.graph.node import Node
from plait.nn.module import assign, flush_pending, realize_all


class Optimizer:
    """Holds param_groups (dicts with 'params' and hyper-parameters) and per-parameter state tensors."""

    defaults: dict[str, Any]

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]):
        self.defaults = defaults
        self.state: dict[int, dict[str, Any]] = {}
        groups = list(params)
        if not groups:
            raise PlaitError(f"{type(self).__name__}: got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.param_groups: list[dict[str, Any]] = []
        for g in groups:
            group = {**defaults, **g, "params": list(g["params"])}
            for p in group["params"]:
                if not isinstance(p, Tensor) or not p.requires_grad:
                    raise PlaitError(f"{type(self).__name__}: every parameter must be a Tensor with requires_grad=True")
            self.param_groups.append(group)
        for group in self.param_groups:
            group.setdefault("initial_lr", group["lr"])

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def _scalar(self, value: float, like: Tensor) -> Tensor:
        """A per-step scalar (learning rate, bias correction) as a 1-element buffer, so that the kernels' source
        stays the same from step to step (a changing literal would recompile them)."""
        return Tensor.from_numpy(np.array(value, dtype=like.dtype.np), device=like.device)

    def step(self) -> None:
        """Update every parameter that has a gradient; all updates compile and run as one plan."""
        updates: list[tuple[Tensor, Node]] = []
        states: list[tuple[dict[str, Any], str, Tensor]] = []
        with no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    st = self.state.setdefault(id(p), {})
                    new_p, new_state = self._update(p, p.grad, st, group)
                    updates.append((p, new_p.node))
                    states.extend((st, k, v) for k, v in new_state.items())
        flush_pending()
        realize_all([n for _, n in updates] + [t.node for _, _, t in states])
        for p, n in updates:
            assign(p, n)
        for st, k, v in states:
            st[k] = v

    def _update(
        self, p: Tensor, g: Tensor, state: dict[str, Any], group: dict[str, Any]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        raise NotImplementedError


class SGD(Optimizer):
    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        maximize: bool = False,
    ):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise PlaitError(f"SGD: lr, momentum and weight_decay must be >= 0 (got {lr}, {momentum}, {weight_decay})")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise PlaitError("SGD: nesterov momentum needs momentum > 0 and dampening = 0")
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay}
        super().__init__(params, {**defaults, "nesterov": nesterov, "maximize": maximize})

    def _update(
        self, p: Tensor, g: Tensor, state: dict[str, Any], group: dict[str, Any]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        if group["maximize"]:
            g = -g
        if group["weight_decay"]:
            g = g + p * group["weight_decay"]
        new: dict[str, Tensor] = {}
        mom = group["momentum"]
        if mom:
            buf = state.get("momentum_buffer")
            buf = g if buf is None else buf * mom + g * (1.0 - group["dampening"])
            new["momentum_buffer"] = buf
            g = g + buf * mom if group["nesterov"] else buf
        return p - g * self._scalar(group["lr"], p), new


class Adam(Optimizer):
    _decoupled = False

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        maximize: bool = False,
    ):
        if amsgrad:
            raise PlaitError(f"{type(self).__name__}: amsgrad=True is not supported")
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise PlaitError(f"{type(self).__name__}: invalid lr={lr}, eps={eps} or betas={betas}")
        super().__init__(
            params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "maximize": maximize}
        )

    def _update(
        self, p: Tensor, g: Tensor, state: dict[str, Any], group: dict[str, Any]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        b1, b2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        if group["maximize"]:
            g = -g
        if wd and self._decoupled:
            p = p * self._scalar(1.0 - lr * wd, p)
        elif wd:
            g = g + p * wd
        t = state.get("t", 0) + 1
        state["t"] = t
        m = state.get("exp_avg")
        v = state.get("exp_avg_sq")
        m = g * (1.0 - b1) if m is None else m * b1 + g * (1.0 - b1)
        v = g * g * (1.0 - b2) if v is None else v * b2 + g * g * (1.0 - b2)
        step_size = self._scalar(lr / (1.0 - b1**t), p)
        root_bc2 = self._scalar(1.0 / float(np.sqrt(1.0 - b2**t)), p)
        denom = v.sqrt() * root_bc2 + group["eps"]
        return p - m / denom * step_size, {"exp_avg": m, "exp_avg_sq": v}


class AdamW(Adam):
    """Adam with decoupled weight decay (p *= 1 - lr * weight_decay before the Adam step); default wd 0.01."""

    _decoupled = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        maximize: bool = False,
    ):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize)
