import io
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from rlx.cli import app
from rlx.launch.display import Display
from rlx.launch.run_dir import archive_previous_run

ROOT = Path(__file__).resolve().parents[2]

runner = CliRunner()


def test_plot_writes_an_image_from_a_metrics_file(tmp_path):
    rows = [{"step": 0, "eval_accuracy": 0.2}] + [{"step": s, "reward_mean": 0.1 * s} for s in range(1, 6)]
    rows.append({"step": 5, "eval_accuracy": 0.5})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 6, "rew')
    out = tmp_path / "curve.png"
    result = runner.invoke(app, ["plot", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_plot_names_missing_metrics_and_files(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.3}) + "\n")
    result = runner.invoke(app, ["plot", str(tmp_path), "-m", "kl"])
    assert result.exit_code == 2 and "no values for kl" in result.output and "reward_mean" in result.output
    assert "only null" not in result.output  # kl is not in the file at all
    result = runner.invoke(app, ["plot", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no metrics file" in result.output


def test_plot_refuses_unreadable_metrics_and_unwritable_images_in_one_line(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_bytes(b'{"step": 1, "reward_mean": 0.3}\n\xff\xfe\n')
    (tmp_path / "a_file").write_text("")
    cases = [
        ([str(tmp_path)], "is not UTF-8 text"),
        ([str(tmp_path), "--out", str(tmp_path / "curve.txt")], "cannot tell the image format from .txt"),
        ([str(tmp_path), "--out", str(tmp_path)], "cannot tell the image format"),
        ([str(tmp_path), "--out", str(tmp_path / "a_file" / "curve.png")], "is a file, not a directory"),
    ]
    for args, expected in cases:
        result = runner.invoke(app, ["plot", *args])
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
        assert expected in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "metrics.jsonl"]


def test_plot_draws_a_metric_named_with_escape_sequences_without_passing_them_on(tmp_path, recwarn):
    name = "reward\x1b[2J"
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, name: 0.3}) + "\n")
    result = runner.invoke(app, ["plot", str(tmp_path), "-m", name, "--out", str(tmp_path / "p.png")])
    assert result.exit_code == 0, result.output
    assert not [w for w in recwarn if "\x1b" in str(w.message)]  # matplotlib warns about glyphs it cannot draw


def test_plot_refuses_a_huge_metrics_file_without_reading_it(tmp_path):
    with open(tmp_path / "metrics.jsonl", "wb") as f:
        f.truncate(64 << 30)  # sparse
    result = runner.invoke(app, ["plot", str(tmp_path), "--out", str(tmp_path / "p.png")])
    assert result.exit_code == 2 and "64 GiB, far more than any run's metrics" in result.output, result.output


def test_plot_writes_into_the_run_directory_by_default(tmp_path, monkeypatch):
    """Two runs plotted from one directory: each image lands beside its run's metrics, none in the current
    directory, and a plot of other metrics does not overwrite the first."""
    monkeypatch.chdir(tmp_path)
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        rows = [{"step": s, "reward_mean": 0.1 * s, "kl": 0.01 * s, "eval_accuracy": 0.2} for s in range(3)]
        (tmp_path / run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert runner.invoke(app, ["plot", run]).exit_code == 0
    assert runner.invoke(app, ["plot", "a", "-m", "kl"]).exit_code == 0
    assert sorted(p.name for p in (tmp_path / "a" / "plots").glob("*.png")) == [
        "metrics-kl.png",
        "metrics-reward_mean-eval_accuracy.png",
    ]
    assert (tmp_path / "b" / "plots" / "metrics-reward_mean-eval_accuracy.png").is_file()
    assert not list(tmp_path.glob("*.png"))


def test_the_default_plot_moves_aside_with_its_run(tmp_path):
    """A new run in the same directory moves the old run's outputs aside: its plot goes with them, so no image of
    the old run stays beside the new run's metrics."""
    run_dir = tmp_path / "quickstart"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward_mean": 0.1 * s}) + "\n" for s in range(3))
    )
    result = runner.invoke(app, ["plot", str(run_dir)])
    assert result.exit_code == 0, result.output
    image = run_dir / "plots" / "metrics-reward_mean-eval_accuracy.png"
    assert image.is_file() and str(image) in "".join(result.output.split())  # the path wraps at 80 columns
    archive = archive_previous_run(run_dir, Display(1, console=Console(file=io.StringIO())))
    assert (archive / "plots" / image.name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(run_dir.iterdir()) == []


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path):
    """With matplotlib not importable (a module on PYTHONPATH that fails as a missing one does), one line naming the
    pip command, no traceback, no image."""
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n"
    )
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.3}) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "rlx", "plot", str(tmp_path)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow.parent), str(ROOT)])),
        timeout=120,
        check=False,
    )
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 2 and len(output.splitlines()) == 1, output
    assert output == "error: rlx plot needs matplotlib: pip install matplotlib (or pip install 'rlx[logging]')"
    assert not (tmp_path / "plots").exists()


def test_plot_of_a_run_without_held_out_accuracy(tmp_path):
    """Step 0 of an external task's run logs eval_accuracy null: the default plot draws the reward alone; asking
    for eval_accuracy says it was never measured and lists only metrics that have values."""
    rows = [{"step": 0, "eval_accuracy": None}] + [{"step": s, "reward_mean": 0.1 * s} for s in range(1, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = runner.invoke(app, ["plot", str(tmp_path)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["plot", str(tmp_path), "-m", "eval_accuracy"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "eval_accuracy: only null, never measured" in text, text
    assert "metrics with values: reward_mean;" in text
