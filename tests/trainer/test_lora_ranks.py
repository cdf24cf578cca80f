"""LoRA on two trainer ranks (FSDP2 over gloo, adapters sharded with the model): the same steps as one rank
on the same batch, and a checkpoint written by two ranks (PEFT format) that two ranks resume exactly."""

import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlx.formats.checkpoint import ADAPTER_CONFIG, ADAPTER_FILE, verify_checkpoint
from tests.trainer.test_ranks import finish_world, start_world

pytestmark = pytest.mark.slow


def start_lora_world(world: int, model_dir, out: Path, ckpt_root: Path) -> list[subprocess.Popen]:
    """``ranks_step.py --lora`` on ``world`` gloo ranks (see there for what it runs and writes)."""
    return start_world(world, str(model_dir), "--lora", str(out), str(ckpt_root))


def finish_lora_world(procs: list[subprocess.Popen], out: Path) -> tuple[list[float], dict]:
    """Rank 0's losses (step 1, step 2, step 2 again after resuming from step 1's checkpoint) and tensors."""
    return finish_world(procs)["losses"], load_file(str(out))


def part(tensors: dict, prefix: str) -> dict:
    return {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}


def assert_same(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        torch.testing.assert_close(tensor, b[name], rtol=0, atol=atol, msg=name)


@pytest.fixture(scope="module")
def one_and_two(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_ranks")
    procs = {
        world: start_lora_world(world, tiny_model_dir, root / f"{world}.safetensors", root / f"ckpt{world}")
        for world in (1, 2)
    }  # side by side: most of each run is starting python and loading torch
    try:
        runs = {world: finish_lora_world(procs[world], root / f"{world}.safetensors") for world in (1, 2)}
    finally:
        for proc in (p for group in procs.values() for p in group if p.poll() is None):
            proc.kill()
            proc.wait()
    return root, runs


def test_two_ranks_train_the_adapter_of_one_rank(one_and_two):
    _, runs = one_and_two
    (losses_1, tensors_1), (losses_2, tensors_2) = runs[1], runs[2]
    assert losses_1[:2] == pytest.approx(losses_2[:2], rel=1e-5, abs=1e-6)
    adapter = part(tensors_2, "adapter.")
    assert adapter and all(v.abs().sum() > 0 for v in adapter.values())  # both factors trained away from 0
    assert part(tensors_2, "merged.").keys() >= {"model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight"}
    assert_same(tensors_1, tensors_2, atol=1e-5)  # merged weights (base names) and adapter factors


def test_checkpoint_of_two_ranks_resumes_on_two_ranks(one_and_two):
    root, runs = one_and_two
    ckpt = root / "ckpt2" / "step_00000001"
    manifest = verify_checkpoint(ckpt)
    assert manifest["lora"] is True and manifest["model_files"] == [ADAPTER_FILE]
    assert (ckpt / ADAPTER_CONFIG).is_file() and not (ckpt / "model.safetensors").exists()
    assert_same(
        load_file(str(ckpt / ADAPTER_FILE)), load_file(str(root / "ckpt1" / "step_00000001" / ADAPTER_FILE)), atol=1e-5
    )  # the 2-rank adapter is the full one, under PEFT's names
    optimizer = load_file(str(ckpt / "optimizer.safetensors"))
    assert any(".lora_A." in key and key.endswith("::exp_avg_sq") for key in optimizer)
    losses, tensors = runs[2]
    assert losses[2] == pytest.approx(losses[1], rel=1e-6, abs=1e-7)
    # adapter and Adam moments came back into the shards: the second step repeats exactly
    assert_same(
        part(tensors, "resumed."), {k: v for k, v in tensors.items() if not k.startswith("resumed.")}, atol=1e-6
    )


def test_rlx_train_lora_on_two_ranks_with_adapter_sync(tiny_model_dir, tmp_path):
    """`rlx train` with two ranks and the adapter-only sync into the hf server, checksums verified."""
    from tests.launch.test_train import read_metrics, run_to_end, small_config

    config = small_config(
        tmp_path,
        tiny_model_dir,
        "hf",
        checkpoint={"every": 2, "keep": 1},
        model={"lora": {"rank": 8, "alpha": 16.0, "target_modules": ["q_proj", "v_proj"]}},
        trainer={"num_ranks": 2, "eval_every": 0},
    )
    code, output = run_to_end(config, tmp_path, "trainer.total_steps=2", "model.lora.sync=adapter", "sync.verify=true")
    assert code == 0, output[-4000:]
    run_dir = tmp_path / "run"
    assert [r["step"] for r in read_metrics(run_dir) if "time_sync" in r] == [1, 2]
    ckpt = run_dir / "checkpoints" / "step_00000002"
    assert verify_checkpoint(ckpt)["lora"] is True and (ckpt / ADAPTER_CONFIG).is_file()
