"""Learning-rate schedules: call `scheduler.step()` once per epoch (or per step), after `optimizer.step()`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from plait.optim.optimizer import Optimizer


class LRScheduler:
    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        self.optimizer = optimizer
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, base_lr: float, epoch: int) -> float:
        raise NotImplementedError

    def step(self) -> None:
        self.last_epoch += 1
        for g, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            g["lr"] = self.lr_at(base, self.last_epoch)

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (epoch // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, epoch: int) -> float:
        return base_lr * self.gamma ** (epoch // self.step_size)


class MultiStepLR(LRScheduler):
    """lr = base_lr * gamma ** (number of milestones <= epoch)."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1, last_epoch: int = -1):
        self.milestones, self.gamma = sorted(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, epoch: int) -> float:
        return base_lr * self.gamma ** sum(1 for m in self.milestones if m <= epoch)


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2 (torch's closed form)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, epoch: int) -> float:
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(epoch)."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float], last_epoch: int = -1):
        self.lr_lambda = lr_lambda
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, epoch: int) -> float:
        return base_lr * self.lr_lambda(epoch)
