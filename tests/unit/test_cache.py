"""The kernel cache: atomic entries with a checksum; corrupt or truncated entries read as missing and are removed."""

import pytest

from plait import settings
from plait.runtime import cache


@pytest.fixture
def cache_dir(tmp_path):
    with settings.override(PLAIT_CACHE_DIR=str(tmp_path)):
        yield tmp_path


def test_roundtrip_and_key_stability(cache_dir):
    key = cache.key_of("cpu", "gcc 13", b"\x00source")
    assert key == cache.key_of("cpu", "gcc 13", b"\x00source")
    assert key != cache.key_of("cpu", "gcc 13", "source2")
    assert cache.key_of("ab", "c") != cache.key_of("a", "bc")  # parts are separated
    assert cache.get("cpu", key) is None
    cache.put("cpu", key, b"binary\n\x00payload")
    assert cache.get("cpu", key) == b"binary\n\x00payload"
    assert (cache_dir / "cpu" / key).exists()
    assert not any(p.name.startswith(".tmp-") for p in (cache_dir / "cpu").iterdir())


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[: len(raw) // 2],  # truncated
        lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]),  # one flipped bit in the payload
        lambda raw: b"garbage",  # no header
        lambda raw: b"",
        lambda raw: raw.replace(b"PLAIT-CACHE-1", b"PLAIT-CACHE-9"),
    ],
)
def test_damaged_entry_reads_as_missing_and_is_removed(cache_dir, damage):
    key = cache.key_of("damage")
    cache.put("opencl", key, b"some kernel binary" * 10)
    path = cache_dir / "opencl" / key
    path.write_bytes(damage(path.read_bytes()))
    assert cache.get("opencl", key) is None
    assert not path.exists()
    cache.put("opencl", key, b"rebuilt")
    assert cache.get("opencl", key) == b"rebuilt"
