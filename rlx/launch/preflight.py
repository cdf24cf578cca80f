"""Checks that run before any process of `rlx train` starts: model directory (built first when
``model.build_if_missing`` asks for it), task data and reward function, stale weight-sync buffers.
A mistake found here is one line naming the fix; nothing has been started yet.
"""

from __future__ import annotations

from pathlib import Path

from rlx.launch.display import Display
from rlx.sync.transports.shm import remove_stale_segments


def preflight(cfg, display: Display) -> None:
    """Fail before any process starts: model directory, task data and reward function."""
    from rlx.engine.model import check_model_dir
    from rlx.rollout.tasks import build_task

    if cfg.model.build_if_missing and not Path(cfg.model.path, "config.json").is_file():
        build_model(cfg, display)
    check_model_dir(cfg.model.path)
    build_task(cfg.task)
    for path in remove_stale_segments():
        display.note(f"removed {path}, the weight-sync buffer of an rlx run that was killed")


def build_model(cfg, display: Display) -> None:
    from rich.progress import Progress

    from rlx.engine.warmstart import build_tiny_math_warmstart

    if cfg.model.build_if_missing == "qwen2_0p5b_random":
        from rlx.engine.tiny import build_qwen2_0p5b_random

        display.note(f"building a random Qwen2-0.5B-shaped model into {cfg.model.path}")
        build_qwen2_0p5b_random(cfg.model.path, seed=cfg.trainer.seed)
        return
    display.note(f"building the warm-started tiny model into {cfg.model.path} (first run only)")
    with Progress(console=display.console, transient=True) as progress:
        task = progress.add_task("warm start", total=1)
        build_tiny_math_warmstart(cfg.model.path, cfg.task, seed=cfg.trainer.seed,
                                  progress=lambda s, n, loss: progress.update(task, completed=s, total=n))
