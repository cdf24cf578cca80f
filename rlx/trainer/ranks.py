"""The trainer ranks in lock-step: one ``RankGroup`` whose methods run the same code on every rank.

Rank 0 (the controller inside `rlx train`) calls a method of its group; the method first announces
its command (one small integer tensor broadcast over torch.distributed, no pickle), then runs.
Ranks 1..N-1 sit in ``RankGroup.follow``: each command they receive runs the same method on them.
Every collective the trainer runs (the batch broadcast or the store notice, FSDP2 gathers,
checkpoint gathering) is then entered by all ranks in the same order, with its arguments written
once, in that method. ``python -m rlx.trainer.ranks ROLE_FILE`` is the entry point of ranks 1..N-1 (ROLE_FILE:
the ``TrainerRole`` the launcher writes, ``rlx.config.roles``).

What only rank 0 has comes in as arguments that the others leave out: the step's samples
(``train``), the run's state a checkpoint records (``checkpoint``).
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from rlx.trace import tracer

if TYPE_CHECKING:
    from rlx.config.roles import TrainerRole
    from rlx.store.base import Sample
    from rlx.trainer.batch import TrainBatch
    from rlx.trainer.trainer import Trainer

RANK_TIMEOUT = timedelta(minutes=10)


class Command(enum.IntEnum):
    TRAIN = 1
    SYNC = 2
    CHECKPOINT = 3
    LOAD = 4
    STOP = 5


class RankGroup:
    """The trainer's ranks (one rank alone is a group of one, announcing nothing)."""

    def __init__(self, cfg: TrainerRole, trainer: Trainer, pad_id: int = 0) -> None:
        """``pad_id``: what rank 0 pads the step's batch with (the other ranks receive padded rows)."""
        self.trainer, self.device, self.pad_id = trainer, trainer.device, pad_id
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.active = dist.is_initialized() and dist.get_world_size() > 1
        self.ckpt_root = Path(cfg.trainer.output_dir).resolve() / "checkpoints"
        self.model_path, self.keep = cfg.model.path, cfg.checkpoint.keep
        self.bytes_sent = 0  # by rank 0 to the others, commands and what follows them (a batch or its notice)
        self.plane = self.puller = None  # trainer.data_plane=store: ranks > 0 pull their rows from the sample store
        if self.active and cfg.trainer.data_plane == "store":
            from rlx.trainer.plane import DataPlane, Puller

            if self.rank == 0:
                self.plane = DataPlane(cfg.store, pad_id, self.device)
            else:
                self.puller = Puller(self.device)

    def _announce(self, command: Command, step: int = 0) -> None:
        if self.active and self.rank == 0:
            dist.broadcast(torch.tensor([int(command), step], device=self.device), 0)
            self.bytes_sent += 16

    def train(self, samples: list[Sample] | None = None) -> dict[str, float]:
        """One update on the step's samples (rank 0 passes them; the others receive their rows)."""
        sent = self.bytes_sent
        self._announce(Command.TRAIN)
        with tracer.span("train.batch"):
            batch = self._batch(samples)
        metrics = self.trainer.step(batch)
        if self.plane is not None:
            metrics.update(self.plane.done())
        if self.active and self.rank == 0:
            metrics["rank_bus_bytes"] = float(self.bytes_sent - sent)  # what rank 0 sent the others to train
        return metrics

    def _batch(self, samples: list[Sample] | None) -> TrainBatch:
        """The step's padded batch, built from the samples on rank 0 and sent from there."""
        from rlx.trainer.batch import batch_bytes, broadcast_batch, collate

        if self.puller is not None:
            return self.puller.receive()
        batch = collate(samples, self.pad_id) if self.rank == 0 else None
        if self.plane is not None:
            self.bytes_sent += self.plane.send(samples, batch)
            return batch
        if not self.active:
            return batch
        if self.rank == 0:
            self.bytes_sent += batch_bytes(batch)
        return broadcast_batch(batch, self.device).to(torch.device("cpu"))

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights for a sync; every rank iterates them to the end (FSDP2 gathers each), rank 0 sends."""
        self._announce(Command.SYNC)
        return self.trainer.named_tensors()

    def checkpoint(
        self, step: int, state: dict[str, Any] | None = None, before_manifest: Callable[[Path], None] | None = None
    ) -> None:
        """Save step ``step`` (gathered from every rank, written by rank 0 with the run's ``state``)."""
        if self.trainer.megatron:  # torch_dist, written by every rank
            from rlx.trainer.megatron.checkpoint import save_checkpoint
        else:
            from rlx.trainer.checkpoint import save_checkpoint

        self._announce(Command.CHECKPOINT, step)
        t = self.trainer
        save_checkpoint(
            self.ckpt_root,
            step,
            t.model,
            t.optimizer,
            t.scheduler,
            self.model_path,
            state or {},
            self.keep,
            before_manifest=before_manifest,
        )

    def load(self, step: int) -> dict[str, Any]:
        """Restore step ``step``'s checkpoint on every rank; the state rank 0 saved with it."""
        from rlx.formats.checkpoint import step_dir_name

        if self.trainer.megatron:
            from rlx.trainer.megatron.checkpoint import load_checkpoint
        else:
            from rlx.trainer.checkpoint import load_checkpoint

        self._announce(Command.LOAD, step)
        t, ckpt = self.trainer, self.ckpt_root / step_dir_name(step)
        state = load_checkpoint(ckpt, t.model, t.optimizer, t.scheduler)
        t.load_extra(ckpt)
        return state

    def stop(self) -> None:
        """Release the followers (they return from ``follow``) and the data plane."""
        try:
            self._announce(Command.STOP)
        finally:
            for plane in (self.plane, self.puller):
                if plane is not None:
                    plane.close()
            self.plane = self.puller = None

    def follow(self) -> None:
        """Ranks 1..N-1: run each method rank 0 announces, until STOP."""
        while True:
            message = torch.zeros(2, dtype=torch.long, device=self.device)
            dist.broadcast(message, 0)
            command, step = Command(int(message[0])), int(message[1])
            if command == Command.TRAIN:
                self.train()
            elif command == Command.SYNC:
                for _ in self.weights():
                    pass
            elif command == Command.CHECKPOINT:
                self.checkpoint(step)
            elif command == Command.LOAD:
                self.load(step)
            elif command == Command.STOP:
                return


def init_distributed(device_type: str) -> None:
    """Join the process group described by RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ["RANK"]) % torch.cuda.device_count())
    dist.init_process_group(backend, timeout=RANK_TIMEOUT)


def follow(cfg: TrainerRole) -> None:
    """Ranks 1..N-1: build this rank's trainer and follow rank 0 until it stops the group."""
    from rlx.trainer.trainer import Trainer

    group = RankGroup(cfg, Trainer(cfg))
    try:
        group.follow()
    finally:
        group.stop()  # on ranks > 0 it announces nothing: it closes the store's readers


def main() -> None:
    from rlx.config.redact import SECRET_ENV
    from rlx.config.roles import TrainerRole, read_role
    from rlx.placement import device_type
    from rlx.trace import tracer

    cfg = read_role(sys.argv[1], TrainerRole, secret=os.environ.get(SECRET_ENV["rollout.auth_token"], ""))
    init_distributed(device_type(cfg.trainer.device))
    tracer.configure_from_env("trainer", f"trainer{dist.get_rank()}")
    try:
        follow(cfg)
    finally:
        tracer.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
