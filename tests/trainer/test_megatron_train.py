"""`rlx train configs/quickstart.yaml trainer.backend=megatron` end to end: the launcher, the rollout server, the
megatron trainer and its weight syncs into the engine, every sync verified by checksum (sync.verify), and the final
checkpoint in torch_dist. The quickstart's settings on the session's tiny model, with fewer steps. Its syncs are
zero-copy: the parameters and the q, k and v split out of each fused q/k/v lie in the weight arena."""

import json
import math
from pathlib import Path

import pytest

from rlx.formats.checkpoint import verify_checkpoint
from tests.helpers import start_rlx, stop_group

pytest.importorskip("megatron.core")

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


@pytest.mark.slow
def test_quickstart_trains_with_megatron_and_verifies_every_sync(tiny_model_dir, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    args = [
        "train",
        str(QUICKSTART),
        "trainer.backend=megatron",
        "trainer.total_steps=3",
        "trainer.eval_every=3",
        "task.num_eval=32",
        "sync.verify=true",
        f"model.path={tiny_model_dir}",
        f"trainer.output_dir={run_dir}",
    ]
    proc = start_rlx(args, log)
    try:
        code = proc.wait(timeout=400)
    finally:
        stop_group(proc)
    assert code == 0, log.read_text()[-4000:]
    lines = [json.loads(row) for row in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "sync_verified" in line]
    assert [line["step"] for line in steps] == [1, 2, 3]
    assert all(line["sync_verified"] == 1.0 for line in steps)
    # one rank in the engine's dtype: every tensor is sent from the weight arena, the split q/k/v too
    assert all(line["sync_zero_copy"] == 1.0 for line in steps), [line["sync_zero_copy"] for line in steps]
    # the trainer scores the engine's tokens as the engine did: mean |logp_train - logp_rollout| near float32 noise
    assert all(math.isfinite(line["loss"]) and line["logprob_diff_mean"] < 1e-4 for line in steps)
    evaluated = [line["step"] for line in lines if "eval_accuracy" in line]
    assert evaluated[0] == 0 and evaluated[-1] == 3
    (final,) = (run_dir / "checkpoints").iterdir()  # checkpoint.save_final: the last step, in torch_dist
    manifest = verify_checkpoint(final)
    assert manifest["backend"] == "megatron" and manifest["step"] == 3
    assert (final / "megatron" / "metadata.json").is_file()
