"""The run config, ``RunConfig``: one section per role or layer, each a dataclass in its own module of
``rlx.config`` that checks its own fields in ``__post_init__``; the checks across sections are ``rlx.config.cross``.

Every field carries a one-line docstring (units, meaning). Choice fields are typed ``str``
because OmegaConf cannot type ``Literal``; their allowed values live in the ``*_CHOICES``
constants beside each section and are enforced by its ``__post_init__``. No config module imports torch or vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlx.config.agent import AgentConfig, OpenEnvConfig  # noqa: F401 (names agent.openenv's section type for the loader)
from rlx.config.algorithm import AlgorithmConfig
from rlx.config.checks import check_all_finite, check_choice
from rlx.config.cross import check_run
from rlx.config.model import ModelConfig
from rlx.config.outputs import CheckpointConfig, LoggingConfig, TraceConfig
from rlx.config.placement import PlacementConfig
from rlx.config.ray import RayConfig
from rlx.config.rollout import RolloutConfig, SamplingConfig
from rlx.config.store import FiltersConfig, StoreConfig
from rlx.config.sync import SyncConfig
from rlx.config.task import TaskConfig
from rlx.config.trainer import TrainerConfig

LAUNCHER_CHOICES = ("local", "ray")


@dataclass
class RunConfig:
    run_name: str = "run"
    """Name of the run; the default run directory is runs/<run_name>."""
    launcher: str = "local"
    """Where `rlx train` starts its processes: local (this host, no Ray) or ray (placement groups on a Ray cluster)."""
    ray: RayConfig = field(default_factory=RayConfig)
    """The Ray cluster and per-role resources (launcher=ray)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Prompts, ground truth and reward."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout servers and sampling."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages, policy loss, KL and rollout correction."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Optimisation, ranks and the step loop."""
    sync: SyncConfig = field(default_factory=SyncConfig)
    """Trainer -> rollout weight transfer."""
    store: StoreConfig = field(default_factory=StoreConfig)
    """The sample store the trainer ranks pull their rows from (trainer.data_plane=store)."""
    filters: FiltersConfig = field(default_factory=FiltersConfig)
    """DAPO sampling filters applied to each step's groups before training."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoint cadence and retention."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Metric sinks."""
    trace: TraceConfig = field(default_factory=TraceConfig)
    """Span tracing."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Multi-turn episodes with tools (rlx.agent)."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Which GPUs each role gets: separate, or colocated (taking turns); see rlx.placement."""

    def __post_init__(self) -> None:
        check_all_finite(self)
        check_choice("launcher", self.launcher, LAUNCHER_CHOICES)
        self.trainer.micro_batch_size = min(
            self.trainer.micro_batch_size, self.trainer.prompts_per_step * self.rollout.n
        )
        check_run(self)

    @property
    def sampling(self) -> SamplingConfig:
        """``rollout.sampling``: what both the collector and the trainer read of how completions are sampled."""
        return self.rollout.sampling

    @property
    def lora_sync(self) -> str:
        """What a sync moves once 'auto' is resolved: adapter, merged, or none (no LoRA: the whole model)."""
        if not self.model.lora.rank:
            return "none"
        if self.model.lora.sync != "auto":
            return self.model.lora.sync
        # vLLM applies a LoRA at every forward: measured on CPU it generated ~3x slower than the merged model
        # (README, LoRA), so there the adapter is opted into; the hf server merges it into plain weights
        return "adapter" if self.rollout.backend == "hf" else "merged"

    @property
    def correction(self) -> str:
        """The rollout correction in force once 'auto' is resolved."""
        if self.algorithm.rollout_correction != "auto":
            return self.algorithm.rollout_correction
        return "none" if self.trainer.mode == "sync" else "bypass"
