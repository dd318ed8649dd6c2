"""Save and load state dicts in the safetensors format (readable by torch's safetensors loader, and back).

>>> import plait, tempfile, os
>>> m = plait.nn.Linear(2, 2, device="cpu")
>>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
>>> plait.nn.save(m, path)
>>> _ = m.load_state_dict(plait.nn.load(path))
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from plait.errors import PlaitError
from plait.frontends.native.tensor import Tensor
from plait.nn.module import Module


def save(obj: Module | Mapping[str, Any], path: str | Path) -> None:
    """Write a module's state_dict (or a dict of tensors/arrays) to a .safetensors file."""
    from safetensors.numpy import save_file

    sd = obj.state_dict() if isinstance(obj, Module) else obj
    arrays = {k: _contiguous(v.numpy() if isinstance(v, Tensor) else np.asarray(v)) for k, v in sd.items()}
    save_file(arrays, str(path))


def load(path: str | Path) -> dict[str, np.ndarray]:
    """Read a .safetensors file into a dict of NumPy arrays, ready for Module.load_state_dict."""
    from safetensors.numpy import load_file

    if not Path(path).exists():
        raise PlaitError(f"load: no safetensors file at {path}")
    return dict(load_file(str(path)))


def _contiguous(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(a.shape)  # keep 0-d arrays 0-d (num_batches_tracked)
