"""`rlx bench-sync` end to end on the tiny model: rows, JSON and verification (no timing asserts)."""

import json

from typer.testing import CliRunner

from rlx.cli import app

runner = CliRunner()


def test_bench_sync_on_a_model_directory_writes_verified_rows(tiny_model_dir, tmp_path, our_segments):
    out = tmp_path / "bench.json"
    result = runner.invoke(
        app,
        [
            "bench-sync",
            "--model",
            str(tiny_model_dir),
            "--bucket-mb",
            "1",
            "--repeats",
            "1",
            "--verify",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    modes = [row["mode"] for row in data["rows"]]
    assert modes == ["ceiling", "lock-step", "double", "zero-copy"]
    for row in data["rows"]:
        assert row["bytes"] > 0 and row["seconds"] > 0
    assert [len(row["all_seconds"]) for row in data["rows"]] == [1, 1, 1, 1]
    assert [row["verified"] for row in data["rows"][1:]] == [True, True, True]
    assert all(row["ok"] for row in data["rows"])  # measured, and the checksums matched where checked
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


def test_the_receiver_gpu_follows_the_transport(monkeypatch):
    """nccl puts the receiver on another GPU (NCCL refuses two ranks on one), cuda_ipc shares GPU 0 unless told;
    the receiver then sees its own GPU first and the sender's after it, so CUDA IPC works peer-to-peer."""
    import pytest

    from rlx.bench.sync import receiver_env, receiver_gpu

    assert receiver_gpu("nccl", None, 2) == 1 and receiver_gpu("cuda_ipc", None, 2) == 0
    assert receiver_gpu("cuda_ipc", 1, 2) == 1 and receiver_gpu("shm", None, 0) is None
    with pytest.raises(ValueError, match="needs two GPUs"):
        receiver_gpu("nccl", None, 1)
    with pytest.raises(ValueError, match="pass --receiver-gpu 1"):
        receiver_gpu("nccl", 0, 2)
    with pytest.raises(ValueError, match="not one of the 2 visible GPUs"):
        receiver_gpu("nccl", 5, 2)
    assert receiver_env(None) == {}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert receiver_env(1) == {"CUDA_VISIBLE_DEVICES": "6,4"} and receiver_env(0) == {"CUDA_VISIBLE_DEVICES": "4"}


def test_bench_sync_over_gloo_keeps_each_senders_group_across_bucket_sizes(tiny_model_dir, tmp_path):
    """The ceiling and every transfer keep their groups across rounds: with three bucket sizes the receiver
    holds more senders' groups than it keeps, and drops the least recently used, never the ceiling's."""
    out = tmp_path / "bench.json"
    args = ["bench-sync", "--model", str(tiny_model_dir), "--transport", "gloo", "--repeats", "2", "--verify"]
    for mb in ("1", "2", "4"):
        args += ["--bucket-mb", mb]
    result = runner.invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [(r["mode"], r["bucket_mb"]) for r in rows] == [
        ("ceiling", None),
        ("lock-step", 1),
        ("double", 1),
        ("lock-step", 2),
        ("double", 2),
        ("lock-step", 4),
        ("double", 4),
    ]
    assert all(r["ok"] for r in rows) and all(r["verified"] for r in rows[1:])
    assert len(rows[0]["all_seconds"]) == 3 * 2  # the ceiling ran every timed round of every bucket size


def test_bench_sync_streams_a_line_per_row_through_a_pipe(tiny_model_dir, tmp_path):
    """Read through a pipe, as `rlx bench-sync | tee` is: each row's line arrives when the row is measured, before
    the bench ends (its JSON is not written yet), and the table and JSON still come at the end."""
    import subprocess
    import sys

    out = tmp_path / "bench.json"
    args = ["bench-sync", "--model", str(tiny_model_dir), "--repeats", "2", "--verify", "--json", str(out)]
    for mb in ("1", "2", "4"):
        args += ["--bucket-mb", mb]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlx", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("measured "):
                break
        first = f"measured {tiny_model_dir.name} shm lock-step 1 MiB: "
        assert lines and lines[-1].startswith(first) and lines[-1].endswith(" GB/s\n"), "".join(lines)
        assert not out.exists(), "the first row's line came only when the bench had ended"
        rest = proc.stdout.read()
    finally:
        proc.stdout.close()
        proc.wait(timeout=300)
    assert proc.returncode == 0, "".join(lines) + rest
    measured = [line for line in "".join(lines).splitlines() + rest.splitlines() if line.startswith("measured ")]
    modes = [" ".join(line.split(":")[0].split()[3:]) for line in measured]
    assert modes == [f"{m} {mb} MiB" for mb in (1, 2, 4) for m in ("lock-step", "double", "zero-copy")] + ["ceiling"]
    assert "weight sync" in rest and "x ceil" in rest  # the table
    assert len(json.loads(out.read_text())["rows"]) == 10
