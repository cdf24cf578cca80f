"""What the sample store and the rollout dumps need before a run starts: the dump ``rollout.reuse`` reads fits
this run (``rlx.store.dump.check_dump``), and the sample stores of killed runs are removed."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlx.config.rollout import RolloutConfig


def check_store(model_path: str, rollout: RolloutConfig, total_steps: int) -> None:
    """The dump rollout.reuse reads: every step file it needs, of this model, tokenizer and group size."""
    if rollout.reuse:
        from rlx.store.dump import check_dump

        check_dump(model_path, rollout, total_steps)


def remove_stale() -> list[str]:
    """The /dev/shm segments of sample stores whose run was killed, removed."""
    from rlx.store.shm import remove_stale_segments

    return remove_stale_segments()
