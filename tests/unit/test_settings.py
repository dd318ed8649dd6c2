"""The settings registry: typed defaults, environment, overrides."""

import pytest

from plait import settings


def test_defaults_environment_and_override(monkeypatch):
    monkeypatch.delenv("PLAIT_NUM_THREADS", raising=False)
    assert settings.get("PLAIT_NUM_THREADS") == 0
    monkeypatch.setenv("PLAIT_NUM_THREADS", "3")
    assert settings.get("PLAIT_NUM_THREADS") == 3  # typed: the registry converts the string
    with settings.override(PLAIT_NUM_THREADS=5):
        assert settings.get("PLAIT_NUM_THREADS") == 5
        with settings.override(PLAIT_NUM_THREADS=6):
            assert settings.get("PLAIT_NUM_THREADS") == 6
        assert settings.get("PLAIT_NUM_THREADS") == 5
    assert settings.get("PLAIT_NUM_THREADS") == 3


def test_empty_environment_value_means_default(monkeypatch):
    monkeypatch.setenv("PLAIT_DEBUG", "")
    assert settings.get("PLAIT_DEBUG") == 0


def test_unknown_setting_is_rejected():
    with pytest.raises(KeyError):
        settings.get("PLAIT_NO_SUCH_THING")
    with pytest.raises(KeyError), settings.override(PLAIT_NO_SUCH_THING=1):
        pass


def test_every_setting_is_documented():
    for s in settings.REGISTRY.values():
        assert s.name.startswith("PLAIT_") and s.doc
        assert isinstance(s.default, s.type)
