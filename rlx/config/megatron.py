"""The ``trainer.megatron`` section: the parallel layout of ``trainer.backend=megatron`` (megatron-core's GPTModel).

The sizes are checked here on their own (each >= 1); against the model (heads, layers, vocabulary) and against
``trainer.num_ranks`` in the trainer's pre-flight (``rlx.trainer.preflight``), where the model's config is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.config.checks import check_range

TRAINER_BACKENDS = ("fsdp2", "megatron")


@dataclass
class MegatronConfig:
    tensor_parallel: int = 1
    """Tensor-parallel ranks per layer: attention heads, the MLP and the vocabulary are split over them."""
    pipeline_parallel: int = 1
    """Pipeline stages: the decoder layers are split over them in order."""
    context_parallel: int = 1
    """Context-parallel ranks: each sequence is split over them (refused above 1 for now)."""
    distributed_optimizer: bool = False
    """Shard the optimizer state over the data-parallel ranks (megatron's distributed optimizer; refused for now)."""

    def __post_init__(self) -> None:
        check_range("trainer.megatron.tensor_parallel", self.tensor_parallel, 1)
        check_range("trainer.megatron.pipeline_parallel", self.pipeline_parallel, 1)
        check_range("trainer.megatron.context_parallel", self.context_parallel, 1)

    @property
    def model_parallel(self) -> int:
        """Ranks that hold one copy of the model: tensor x pipeline x context parallel."""
        return self.tensor_parallel * self.pipeline_parallel * self.context_parallel
