"""Weight initialisation with torch.nn's default schemes, drawn from one seeded NumPy generator.

`plait.nn.manual_seed(s)` makes initialisation (and dropout masks) reproducible. The values differ from torch's
(another generator), so side-by-side runs copy weights with load_state_dict.
"""

from __future__ import annotations

import math

import numpy as np

from plait.nn import functional as F

_RNG = [np.random.default_rng(0)]


def manual_seed(seed: int) -> None:
    """Seed weight initialisation and dropout masks."""
    _RNG[0] = np.random.default_rng(seed)
    F.manual_seed(seed + 1)


def uniform(shape: tuple[int, ...], bound: float) -> np.ndarray:
    return _RNG[0].uniform(-bound, bound, size=shape).astype(np.float32)


def normal(shape: tuple[int, ...], std: float = 1.0) -> np.ndarray:
    return (_RNG[0].standard_normal(size=shape) * std).astype(np.float32)


def fan_in_bound(fan_in: int) -> float:
    """torch's default for Linear/Conv weights and biases: kaiming_uniform(a=sqrt(5)) == U(-1/sqrt(fan_in), ...)."""
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0


def kaiming_normal_fan_out(shape: tuple[int, ...]) -> np.ndarray:
    """kaiming_normal_(mode='fan_out', nonlinearity='relu') as torchvision's ResNet and MobileNetV2 use."""
    fan_out = shape[0] * int(np.prod(shape[2:]))
    return normal(shape, math.sqrt(2.0 / fan_out))
