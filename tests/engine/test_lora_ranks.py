"""LoRA on two trainer ranks (FSDP2 over gloo, adapters sharded with the model): the same steps as one rank
on the same batch, and a checkpoint written by two ranks (PEFT format) that two ranks resume exactly."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlx.engine.checkpoint_format import ADAPTER_CONFIG, ADAPTER_FILE, verify_checkpoint

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("ranks_step.py")


def run_world(world: int, model_dir, out: Path, ckpt_root: Path, *extra: str) -> tuple[list[float], dict]:
    """``ranks_step.py --lora`` on ``world`` gloo ranks: rank 0's losses and the tensors it wrote."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), str(model_dir), "--lora", str(out),
                                       str(ckpt_root), *extra], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=300)
            assert proc.returncode == 0, stderr[-3000:]
            outputs.append(stdout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    line = next(l for l in outputs[0].splitlines() if l.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])["losses"], load_file(str(out))


def assert_same(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=name)


@pytest.fixture(scope="module")
def one_and_two(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_ranks")
    runs = {world: run_world(world, tiny_model_dir, root / f"{world}.safetensors", root / f"ckpt{world}")
            for world in (1, 2)}
    return root, runs


def test_two_ranks_train_the_adapter_of_one_rank(one_and_two):
    _, runs = one_and_two
    (losses_1, tensors_1), (losses_2, tensors_2) = runs[1], runs[2]
    assert losses_1 == pytest.approx(losses_2, rel=1e-5, abs=1e-6)
    adapter = {k: v for k, v in tensors_2.items() if k.startswith("adapter.")}
    assert adapter and all(v.abs().sum() > 0 for k, v in adapter.items())  # both factors trained away from 0
    assert_same(tensors_1, tensors_2, atol=1e-5)  # merged weights (base names) and adapter factors


def test_checkpoint_of_two_ranks_resumes_on_two_ranks(one_and_two, tiny_model_dir):
    root, runs = one_and_two
    ckpt = root / "ckpt2" / "step_00000001"
    manifest = verify_checkpoint(ckpt)
    assert manifest["lora"] is True and manifest["model_files"] == [ADAPTER_FILE]
    assert (ckpt / ADAPTER_CONFIG).is_file() and not (ckpt / "model.safetensors").exists()
    assert_same(load_file(str(ckpt / ADAPTER_FILE)), load_file(str(root / "ckpt1" / "step_00000001" / ADAPTER_FILE)),
                atol=1e-5)  # the 2-rank adapter is the full one, under PEFT's names
    optimizer = load_file(str(ckpt / "optimizer.safetensors"))
    assert any(".lora_A." in key and key.endswith("::exp_avg_sq") for key in optimizer)
    losses, resumed = run_world(2, tiny_model_dir, root / "resumed.safetensors", root / "ckpt2", "--resume")
    assert losses == pytest.approx(runs[2][0][1:], rel=1e-6, abs=1e-7)
    assert_same(resumed, runs[2][1], atol=1e-6)  # adapter and Adam moments came back: the second step repeats
