"""The ``placement`` section: which GPUs each role gets (``rlx.placement`` plans from it)."""

from __future__ import annotations

from dataclasses import dataclass

from rlx.config.checks import check_choice, check_range

PLACEMENT_CHOICES = ("separate", "colocated")


@dataclass
class PlacementConfig:
    mode: str = "separate"
    """separate (each trainer rank and each rollout server its own GPUs) or colocated (the servers on the trainer's
    GPUs, taking turns: engines sleep while the trainer trains, the trainer offloads while they generate)."""
    rollout_gpus: int = 0
    """GPUs of the launched rollout servers; 0 = rollout.num_servers x rollout.tensor_parallel_size."""
    sleep_level: int = 1
    """colocated: engines sleep during training; 1 = weights to CPU and KV cache freed, 2 = both freed (the
    sync brings the weights back), 0 = never sleep."""
    offload: bool | None = None
    """colocated: the trainer moves parameters and optimizer state to CPU while the engines generate; unset = only
    where its state and the engine's awake memory do not fit the GPU together (``rlx.placement.resolve_offload``)."""
    gpu_memory_gb: float = 0.0
    """Memory budget per GPU in GiB that each rlx process respects (a smaller GPU emulated); 0 = the whole GPU."""

    def __post_init__(self) -> None:
        check_choice("placement.mode", self.mode, PLACEMENT_CHOICES)
        check_range("placement.rollout_gpus", self.rollout_gpus, 0)
        check_range("placement.sleep_level", self.sleep_level, 0, 2, hint="0 = the engine never sleeps")
        check_range("placement.gpu_memory_gb", self.gpu_memory_gb, 0.0, hint="0 = the whole GPU")
