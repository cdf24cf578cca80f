"""Rank 0 tells the other trainer ranks what to do next; they follow in lock-step.

Commands are one small integer tensor broadcast over torch.distributed (no pickle): every
collective the trainer runs (FSDP2 gathers, batch broadcast, checkpoint gathering) is then
entered by all ranks in the same order. ``python -m rlx.trainer.ranks CONFIG`` is the entry
point of ranks 1..N-1; rank 0 is the controller inside `rlx train`.
"""

from __future__ import annotations

import enum
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

RANK_TIMEOUT = timedelta(minutes=10)


class Command(enum.IntEnum):
    TRAIN = 1
    SYNC = 2
    CHECKPOINT = 3
    LOAD = 4
    STOP = 5


class RankBus:
    """Rank 0's side: announce a command (and its step) before running it on rank 0 too."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.active = dist.is_initialized() and dist.get_world_size() > 1
        self.bytes_sent = 0  # by rank 0 to the others, commands and what follows them (a batch or its notice)

    def announce(self, command: Command, step: int = 0) -> None:
        if self.active:
            dist.broadcast(torch.tensor([int(command), step], device=self.device), 0)
            self.bytes_sent += 16


def receive(device: torch.device) -> tuple[Command, int]:
    message = torch.zeros(2, dtype=torch.long, device=device)
    dist.broadcast(message, 0)
    return Command(int(message[0])), int(message[1])


def init_distributed(device_type: str) -> None:
    """Join the process group described by RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ["RANK"]) % torch.cuda.device_count())
    dist.init_process_group(backend, timeout=RANK_TIMEOUT)


def follow(cfg) -> None:
    """Ranks 1..N-1: run whatever rank 0 announces until STOP."""
    from rlx.trainer.trainer import Trainer
    from rlx.trainer.plane import Puller

    trainer = Trainer(cfg)
    ckpt_root = Path(cfg.trainer.output_dir) / "checkpoints"
    puller = Puller(trainer.device) if cfg.trainer.data_plane == "store" else None
    try:
        _follow(cfg, trainer, ckpt_root, puller)
    finally:
        if puller is not None:
            puller.close()


def _follow(cfg, trainer, ckpt_root: Path, puller) -> None:
    from rlx.trainer.batch import broadcast_batch
    from rlx.trainer.checkpoint import load_checkpoint, save_checkpoint

    while True:
        command, step = receive(trainer.device)
        if command == Command.TRAIN:
            trainer.step(puller.receive() if puller is not None
                         else broadcast_batch(None, trainer.device).to(torch.device("cpu")))
        elif command == Command.SYNC:
            for _ in trainer.named_tensors():
                pass
        elif command == Command.CHECKPOINT:
            save_checkpoint(ckpt_root, step, trainer.model, trainer.optimizer, trainer.scheduler, cfg.model.path, {},
                            cfg.checkpoint.keep)
        elif command == Command.LOAD:
            from rlx.formats.checkpoint import step_dir_name

            load_checkpoint(ckpt_root / step_dir_name(step), trainer.model, trainer.optimizer, trainer.scheduler)
        elif command == Command.STOP:
            return


def main() -> None:
    from rlx.config import load_config
    from rlx.trace import tracer

    cfg = load_config(sys.argv[1], sys.argv[2:])
    device_type = "cuda" if cfg.trainer.device == "cuda" or (cfg.trainer.device == "auto" and torch.cuda.is_available()) \
        else "cpu"
    init_distributed(device_type)
    tracer.configure_from_env("trainer", f"trainer{dist.get_rank()}")
    try:
        follow(cfg)
    finally:
        tracer.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
