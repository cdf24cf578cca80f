"""`rlx bench-sync` end to end on the tiny model: rows, JSON and verification (no timing asserts)."""

import json

from typer.testing import CliRunner

from rlx.cli import app

runner = CliRunner()


def test_bench_sync_on_a_model_directory_writes_verified_rows(tiny_model_dir, tmp_path, our_segments):
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench-sync", "--model", str(tiny_model_dir), "--bucket-mb", "1", "--repeats", "1",
                                 "--verify", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    modes = [row["mode"] for row in data["rows"]]
    assert modes == ["ceiling", "lock-step", "double", "zero-copy"]
    for row in data["rows"]:
        assert row["bytes"] > 0 and row["seconds"] > 0
    assert [len(row["all_seconds"]) for row in data["rows"]] == [1, 1, 1, 1]
    assert [row["verified"] for row in data["rows"][1:]] == [True, True, True]
    assert data["environment"]["torch_threads"] == 1
    assert "ceiling" in result.output and "lock-step" in result.output and "zero-copy" in result.output
    assert our_segments() == []


def test_bench_sync_rejects_unknown_transport_and_missing_gpu():
    result = runner.invoke(app, ["bench-sync", "--transport", "carrier-pigeon"])
    assert result.exit_code == 2 and "carrier-pigeon" in result.output
    result = runner.invoke(app, ["bench-sync", "--transport", "cuda_ipc", "--preset", "0.5b"])
    import torch

    if not torch.cuda.is_available():
        assert result.exit_code == 2 and "needs a CUDA GPU" in result.output
