"""docs/config.md is the schema's own account of itself: the generator's --check passes on the committed file,
fails naming a stale one, every field has a docstring, and the allowed values it lists are the ones loading a
config enforces."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from rlx.config.errors import ConfigError
from rlx.config.load import load_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "config_reference.py"


@functools.cache
def _generator():
    """scripts/config_reference.py as a module (registered first: its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location("config_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _check(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )


def test_the_committed_reference_is_current():
    result = _check(ROOT / "docs" / "config.md")
    assert result.returncode == 0, result.stderr


def test_check_names_a_stale_reference(tmp_path):
    stale = tmp_path / "config.md"
    text = (ROOT / "docs" / "config.md").read_text()
    assert "| `trainer.lr` |" in text
    stale.write_text(text.replace("| `trainer.lr` |", "| `trainer.learning_rate` |"))
    result = _check(stale)
    assert result.returncode == 1
    assert "is stale" in result.stderr and "trainer.learning_rate" in result.stderr
    assert "python scripts/config_reference.py" in result.stderr


def test_every_field_of_every_section_has_a_docstring():
    generator = _generator()
    found = generator.sections()
    assert {s.path for s in found} >= {
        "model",
        "model.lora",
        "task",
        "task.reward_model",
        "rollout",
        "trainer",
        "agent",
        "store",
        "filters",
        "algorithm.distill",
        "placement",
        "ray",
    }
    missing = generator.missing_docstrings(found)
    assert not missing, f"add a one-line docstring after each of these fields in rlx/config/: {missing}"


def _choice_keys() -> list[tuple[str, tuple]]:
    generator = _generator()
    return [
        (f"{s.path + '.' if s.path else ''}{k.name}", k.choices)
        for s in generator.sections()
        for k in s.keys
        if k.choices
    ]


def test_the_reference_finds_the_choice_lists():
    keys = dict(_choice_keys())
    assert keys["trainer.mode"] == ("sync", "one_step_off", "fully_async")
    assert keys["store.transport"] == ("shm", "tcp")  # a `not in (...)` test, not check_choice
    assert keys["model.rollout_dtype"][0] == "auto" and "bfloat16" in keys["model.rollout_dtype"]
    assert len(keys) >= 30


@pytest.mark.parametrize("key,choices", _choice_keys(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_value_outside_the_listed_choices_is_refused_naming_them(key, choices):
    with pytest.raises(ConfigError) as refused:
        load_config(ROOT / "configs" / "quickstart.yaml", [f"{key}=not_a_choice"])
    message = str(refused.value)
    assert key in message and all(choice in message for choice in choices if choice), message
