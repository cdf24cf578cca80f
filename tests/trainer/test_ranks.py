"""Two trainer ranks (FSDP2 over gloo) give the same step as one rank on the same batch."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("ranks_step.py")


def start_world(world: int, *args: str) -> list[subprocess.Popen]:
    """``ranks_step.py *args`` on ``world`` gloo ranks, side by side."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    return [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), *args],
            env=dict(env, RANK=str(rank)),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for rank in range(world)
    ]


def finish_world(procs: list[subprocess.Popen]) -> dict:
    """Rank 0's RESULT, once every rank exited 0."""
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        outputs.append(out)
    line = next(row for row in outputs[0].splitlines() if row.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


def run_world(world: int, model_dir) -> dict:
    return finish_world(start_world(world, str(model_dir)))


def test_two_ranks_match_one_rank(tiny_model_dir):
    one = run_world(1, tiny_model_dir)
    two = run_world(2, tiny_model_dir)
    assert one["loss"] == pytest.approx(two["loss"], rel=1e-4, abs=1e-6)
    assert one["grad_norm"] == pytest.approx(two["grad_norm"], rel=1e-3)
    assert one["entropy"] == pytest.approx(two["entropy"], rel=1e-4)
    assert one["params"].keys() == two["params"].keys()
    for name in one["params"]:
        assert one["params"][name] == pytest.approx(two["params"][name], rel=1e-4, abs=1e-4), name


def test_a_nan_in_one_ranks_share_skips_the_step_on_every_rank(tiny_model_dir):
    result = finish_world(start_world(2, str(tiny_model_dir), "--nan"))
    assert result == {"skipped_nonfinite": 1.0, "unchanged": True}
