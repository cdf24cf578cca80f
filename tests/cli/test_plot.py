import json

from typer.testing import CliRunner

from rlx.cli import app

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
    assert sorted(p.name for p in (tmp_path / "a").glob("*.png")) == [
        "metrics-kl.png",
        "metrics-reward_mean-eval_accuracy.png",
    ]
    assert (tmp_path / "b" / "metrics-reward_mean-eval_accuracy.png").is_file()
    assert not list(tmp_path.glob("*.png"))


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
