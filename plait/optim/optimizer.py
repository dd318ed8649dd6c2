"""Optimizers with torch.optim's update rules, hyper-parameter names and param_groups."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from plait.errors import PlaitError, TraceError
from plait.frontends.native.tensor import Tensor
from plait.graph.autodiff import no_grad
from plait.graph.node import Node
from plait.nn.module import assign, flush_pending, realize_all
from plait.schedule.plan import capturing, on_replay


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
        self._hyper: dict[tuple[int, str, str], tuple[float, Tensor]] = {}
        self._traced: list[dict[str, Any]] | None = None  # the fixed hyper-parameters a compiled step was traced with

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def _lr(self, gi: int, like: Tensor) -> Tensor:
        """Group `gi`'s learning rate as a 0-d device tensor that keeps its buffer from step to step: the kernels'
        source stays the same when a scheduler changes the rate (a literal would recompile them), and a step replayed
        by plait.compile_step reads the current rate (`_write_lr` rewrites it before each step and each replay)."""
        key = (gi, like.device, like.dtype.name)
        held = self._hyper.get(key)
        if held is None:
            lr = self.param_groups[gi]["lr"]
            held = self._hyper[key] = (lr, Tensor.from_numpy(np.array(lr, dtype=like.dtype.np), device=like.device))
        return held[1]

    def _write_lr(self) -> None:
        """Copy each group's current learning rate into its device scalar when it changed (a scheduler stepped)."""
        for key, (lr, t) in list(self._hyper.items()):
            group = self.param_groups[key[0]]
            if group["lr"] != lr:
                t.node.buffer.device.allocator.copy_in(t.node.buffer, np.array(group["lr"], dtype=t.dtype.np))
                self._hyper[key] = (group["lr"], t)

    def _before_replay(self) -> None:
        """What a step replayed by plait.compile_step needs from Python: the current learning rates. The other
        hyper-parameters are compiled into the kernels, so a change to them since tracing is refused."""
        if self._traced != [self._fixed(g) for g in self.param_groups]:
            raise TraceError(
                f"{type(self).__name__}: a hyper-parameter other than lr changed after plait.compile_step traced the"
                " step (momentum, betas, eps, weight decay... are compiled into its kernels); make a new compiled step"
            )
        self._write_lr()

    @staticmethod
    def _fixed(group: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in group.items() if k not in ("params", "lr", "initial_lr")}

    def step(self) -> None:
        """Update every parameter that has a gradient; all updates compile and run as one plan."""
        updates: list[tuple[Tensor, Node]] = []
        states: list[tuple[dict[str, Any], str, Tensor]] = []
        self._write_lr()
        if capturing():
            self._traced = [self._fixed(g) for g in self.param_groups]
            on_replay(id(self), self._before_replay)
        with no_grad():
            for gi, group in enumerate(self.param_groups):
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    st = self.state.setdefault(id(p), {})
                    new_p, new_state = self._update(p, p.grad, st, group, self._lr(gi, p))
                    updates.append((p, new_p.node))
                    states.extend((st, k, v) for k, v in new_state.items())
        flush_pending()
        realize_all([n for _, n in updates] + [t.node for _, _, t in states])
        for p, n in updates:
            assign(p, n)
        for st, k, v in states:
            st[k] = v

    def _update(
        self, p: Tensor, g: Tensor, state: dict[str, Any], group: dict[str, Any], lr: Tensor
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
        self, p: Tensor, g: Tensor, state: dict[str, Any], group: dict[str, Any], lr: Tensor
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
        return p - g * lr, new


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
        self, p: Tensor, g: Tensor, state: dict[str, Any], group: dict[str, Any], lr: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        b1, b2 = group["betas"]
        wd = group["weight_decay"]
        if group["maximize"]:
            g = -g
        if wd and self._decoupled:
            p = p * (1.0 - lr * wd)
        elif wd:
            g = g + p * wd
        # the step count lives on the device (as torch's capturable Adam keeps it), so that a replayed step advances
        # it and its bias corrections without Python
        t = state.get("step")
        t = Tensor.full((), 1.0, p.dtype, p.device) if t is None else t + 1.0
        m = state.get("exp_avg")
        v = state.get("exp_avg_sq")
        m = g * (1.0 - b1) if m is None else m * b1 + g * (1.0 - b1)
        v = g * g * (1.0 - b2) if v is None else v * b2 + g * g * (1.0 - b2)
        step_size = lr / (1.0 - b1**t)
        denom = v.sqrt() / (1.0 - b2**t).sqrt() + group["eps"]
        return p - m / denom * step_size, {"exp_avg": m, "exp_avg_sq": v, "step": t}


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
