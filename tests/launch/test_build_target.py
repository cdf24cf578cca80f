"""model.build_if_missing builds only where the user meant: a model.path that nearly names an existing model is
refused as a typo, a directory of other files is never replaced, and any build says where it goes."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from rlx.config.errors import ConfigError
from rlx.launch.build_target import check_build_target
from rlx.launch.display import Display

ROOT = Path(__file__).resolve().parents[2]


def fake_model(path: Path) -> Path:
    """A directory the check takes for a model (it reads nothing but the presence of config.json)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def train_quickstart(tmp_path: Path, model_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlx", "train", str(ROOT / "configs" / "quickstart.yaml")]
        + [f"model.path={model_path}", f"trainer.output_dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    "typo", ["models/tiny-math-warmstrat", "modles/tiny-math-warmstart", "models/tiny_math_warmstart"]
)
def test_a_typo_of_an_existing_model_is_refused_naming_it(tmp_path, typo):
    meant = fake_model(tmp_path / "models" / "tiny-math-warmstart")
    result = train_quickstart(tmp_path, tmp_path / typo)
    assert result.returncode == 2, result.stdout + result.stderr
    error = result.stderr.strip()
    assert error.startswith("error: ") and len(error.splitlines()) == 1, error
    assert f"set model.path={meant}" in error and f"mkdir -p {tmp_path / typo}" in error, error
    assert not (tmp_path / typo).exists() and not (tmp_path / "run").exists()
    assert "building" not in result.stdout


def test_a_directory_of_other_files_is_not_replaced(tmp_path):
    mine = tmp_path / "work"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = train_quickstart(tmp_path, mine)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "holds files but no config.json" in result.stderr and "empty" in result.stderr, result.stderr
    assert (mine / "notes.txt").read_text() == "keep me" and not (mine / "config.json").exists()


def announced(path: Path) -> str:
    out = io.StringIO()
    check_build_target(
        str(path),
        "model.path",
        "model.build_if_missing",
        "tiny_math_warmstart",
        Display(1, console=Console(file=out, width=1000)),
    )
    return out.getvalue()


def test_a_build_elsewhere_says_what_it_builds_where_and_how_to_stop_it(tmp_path):
    fake_model(tmp_path / "models" / "warmstart-seed1")
    fake_model(tmp_path / "models" / "tiny-math-warmstart")
    fake_model(tmp_path / "models" / "calc-tools-warmstart.building")  # a warm start stopped part-way
    for path in (
        tmp_path / "models" / "calc-tools-warmstart",  # the quickstart's other models are not near misses
        tmp_path / "models" / "warmstart-seed2",  # a numbered variant, not a typo
        tmp_path / "fresh" / ".cache" / "models" / "tiny-math-warmstart",  # a first run: nothing there
    ):
        note = announced(path)
        assert f"model.path={path} has no model yet" in note, note
        assert "model.build_if_missing=tiny_math_warmstart builds one there" in note and "Ctrl-C" in note, note
    with pytest.raises(ConfigError, match="a typo"):
        announced(tmp_path / "models" / "tiny-math-warmstrat")
    (tmp_path / "models" / "tiny-math-warmstrat").mkdir()  # the way to build there on purpose
    assert "has no model yet" in announced(tmp_path / "models" / "tiny-math-warmstrat")
