"""`rlx train --resume` refuses, before anything starts or is written, a run it cannot continue:
every checkpoint corrupt, none at all, a malformed manifest, another task seed, another model.
The earlier run's files are byte-for-byte unchanged afterwards."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlx.cli import app
from rlx.config import load_config
from rlx.tasks import DataStream, build_task
from rlx.trainer.checkpoint import save_checkpoint
from tests.helpers import write_config

runner = CliRunner()
SMALL = {
    "task": {"max_operand": 9, "num_eval": 16},
    "rollout": {"backend": "hf", "n": 4, "max_tokens": 4},
    "trainer": {"prompts_per_step": 4, "micro_batch_size": 8},
}


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def earlier_run(tmp_path: Path, model_dir: Path, steps=(1, 2)) -> tuple[Path, Path]:
    """A config and its run directory holding real checkpoints of ``steps`` and their metrics rows."""
    from transformers import AutoModelForCausalLM

    from rlx.trainer.optim import build_optimizer, build_scheduler

    run_dir = tmp_path / "run"
    sections = dict(SMALL, trainer=dict(SMALL["trainer"], output_dir=str(run_dir)))
    config = write_config(tmp_path / "run.yaml", model_dir, **sections)
    cfg = load_config(config)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    optimizer, stream = build_optimizer(model, cfg.trainer), DataStream(build_task(cfg.task).train, seed=cfg.task.seed)
    scheduler = build_scheduler(optimizer, cfg.trainer)
    for step in steps:
        stream.next_batch(cfg.trainer.prompts_per_step)
        state = {"step": step, "data": stream.state(), "run_name": cfg.run_name}
        save_checkpoint(run_dir / "checkpoints", step, model, optimizer, scheduler, str(model_dir), state, keep=5)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward_mean": 0.5}) + "\n" for s in steps))
    return config, run_dir


def resume(config: Path, *overrides: str) -> tuple[int, str]:
    result = runner.invoke(app, ["train", str(config), "--resume", *overrides])
    return result.exit_code, result.output


def assert_refused_and_untouched(code: int, output: str, run_dir: Path, before: dict, *fragments: str) -> None:
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    for fragment in fragments:
        assert fragment in output, output
    assert snapshot(run_dir) == before, "the earlier run's files changed"
    assert not (run_dir / "logs").exists() and not (run_dir / "config.yaml").exists(), "something was started"


def corrupt_every_checkpoint(run_dir: Path) -> None:
    for weights in (run_dir / "checkpoints").glob("step_*/model.safetensors"):
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF  # same size, different bytes: only the sha256 tells
        weights.write_bytes(bytes(data))


def test_every_checkpoint_corrupt_or_none_at_all_refuses_and_keeps_the_run(tmp_path, tiny_model_dir):
    config, run_dir = earlier_run(tmp_path, tiny_model_dir)
    corrupt_every_checkpoint(run_dir)
    before = snapshot(run_dir)
    code, output = resume(config)
    assert_refused_and_untouched(
        code,
        output,
        run_dir,
        before,
        "cannot resume the run",
        "none of its 2 checkpoints",
        "sha256",
        "run without --resume",
        "trainer.output_dir",
    )
    shutil.rmtree(run_dir / "checkpoints")
    before = snapshot(run_dir)
    code, output = resume(config)
    assert_refused_and_untouched(code, output, run_dir, before, "it has no checkpoint", "run without --resume")


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda m: [m], "holds a JSON list"),
        (lambda m: dict(m, files={}), "lists no files"),
        (
            lambda m: dict(m, files={k: v for k, v in m["files"].items() if k != "optimizer.safetensors"}),
            "does not list optimizer.safetensors",
        ),
    ],
)
def test_malformed_manifest_is_skipped_and_alone_refused(tmp_path, tiny_model_dir, edit, expected):
    config, run_dir = earlier_run(tmp_path, tiny_model_dir, steps=(1,))
    manifest = run_dir / "checkpoints" / "step_00000001" / "manifest.json"
    manifest.write_text(json.dumps(edit(json.loads(manifest.read_text()))))
    before = snapshot(run_dir)
    code, output = resume(config)
    assert_refused_and_untouched(code, output, run_dir, before, "cannot resume the run", expected)


def test_changed_task_seed_or_model_is_named(tmp_path, tiny_model_dir):
    from rlx.trainer.tiny import build_tiny_model

    config, run_dir = earlier_run(tmp_path, tiny_model_dir)
    before = snapshot(run_dir)
    code, output = resume(config, "task.seed=7")
    assert_refused_and_untouched(
        code, output, run_dir, before, "step_00000002", "saved with task.seed=0", "task.seed=7"
    )
    other = build_tiny_model(tmp_path / "other", hidden_size=32)
    code, output = resume(config, f"model.path={other}")
    assert_refused_and_untouched(
        code,
        output,
        run_dir,
        before,
        "is not the model it was trained from",
        "hidden_size",
        "set model.path to that model",
    )


def test_newest_complete_checkpoint_is_chosen_past_a_corrupt_one(tmp_path, tiny_model_dir):
    from rlx.trainer.checkpoint import check_resumable, resume_checkpoint

    config, run_dir = earlier_run(tmp_path, tiny_model_dir)
    newest = run_dir / "checkpoints" / "step_00000002"
    (newest / "optimizer.safetensors").write_bytes(b"torn")
    cfg = load_config(config)
    ckpt, skipped = resume_checkpoint(run_dir.resolve())
    assert ckpt == (run_dir / "checkpoints" / "step_00000001").resolve()
    assert len(skipped) == 1 and "optimizer.safetensors" in skipped[0]
    check_resumable(ckpt, cfg.model.path, cfg.task.seed, len(build_task(cfg.task).train))
    assert resume_checkpoint(tmp_path / "never_ran") == (None, [])  # a first run may pass --resume

    # the resumed run saves step 2 again: the corrupt directory is kept aside, not deleted
    from transformers import AutoModelForCausalLM

    from rlx.formats.checkpoint import verify_checkpoint
    from rlx.trainer.optim import build_optimizer, build_scheduler

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    optimizer = build_optimizer(model, cfg.trainer)
    save_checkpoint(
        run_dir / "checkpoints",
        2,
        model,
        optimizer,
        build_scheduler(optimizer, cfg.trainer),
        str(tiny_model_dir),
        {"step": 2, "data": {}},
        keep=5,
    )
    [aside] = (run_dir / "checkpoints").glob("corrupt-step_00000002-*")
    assert (aside / "optimizer.safetensors").read_bytes() == b"torn"
    assert verify_checkpoint(newest)["step"] == 2
