"""A plait module as it was at another git revision, loaded beside the current one, for A/B scripts that compare a
kernel file's old and new code in one process."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def module_at(rev: str, path: str, name: str) -> Any:
    """The file `path` (relative to the repository root, e.g. plait/codegen/winograd_c.py) as it was at git revision
    `rev`, loaded as a module of its own named `name`."""
    root = Path(__file__).resolve().parent.parent
    src = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=root, check=True, capture_output=True, text=True).stdout
    file = Path(tempfile.mkdtemp()) / f"{name}.py"
    file.write_text(src)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod
