"""A content-addressed disk cache for kernel sources and binaries.

Entries are written atomically (temp file + rename) so concurrent writers never expose half a file, and each
carries a SHA-256 of its payload so a truncated or corrupt entry is detected, removed and rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

from plait import settings

_MAGIC = b"PLAIT-CACHE-1 "


def cache_dir() -> Path:
    configured = settings.get("PLAIT_CACHE_DIR")
    if configured:
        root = Path(configured)
    else:
        import platformdirs

        root = Path(platformdirs.user_cache_dir("plait"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def key_of(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


def _path(kind: str, key: str) -> Path:
    d = cache_dir() / kind
    d.mkdir(parents=True, exist_ok=True)
    return d / key


def atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def get(kind: str, key: str) -> bytes | None:
    """The payload stored under (kind, key), or None when absent, truncated or corrupt (the bad entry is removed)."""
    path = _path(kind, key)
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    head, sep, payload = raw.partition(b"\n")
    if sep and head.startswith(_MAGIC) and head[len(_MAGIC) :].decode(errors="replace") == _digest(payload):
        return payload
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def put(kind: str, key: str, payload: bytes) -> None:
    atomic_write(_path(kind, key), _MAGIC + _digest(payload).encode() + b"\n" + payload)


def _digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()
