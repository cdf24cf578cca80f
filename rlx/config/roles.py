"""What each process role reads of a run: a typed view cut once from ``RunConfig`` by the launcher (or by the
command that starts the role by hand), written as JSON into the run directory, and parsed by that process alone.

- ``RolloutRole``: a rollout server (``rlx rollout-serve``): the model, the rollout and sync sections, the
  placement it sleeps and budgets memory by, the seed, what a weight sync moves.
- ``TrainerRole``: the trainer ranks: the model, trainer, algorithm, store and checkpoint sections, the sampling
  the logprobs must agree with, the rollout correction in force and what a sync moves.

Only the orchestrator (rank 0's loop), the launcher and the CLI see the whole run. A role file carries no secret:
``write_role`` blanks them, and the process reads them from its environment (``rlx.config.redact.SECRET_ENV``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from rlx.config.algorithm import AlgorithmConfig
from rlx.config.errors import ConfigError
from rlx.config.model import ModelConfig
from rlx.config.outputs import CheckpointConfig
from rlx.config.placement import PlacementConfig
from rlx.config.rollout import RolloutConfig, SamplingConfig
from rlx.config.store import StoreConfig
from rlx.config.sync import SyncConfig
from rlx.config.trainer import TrainerConfig

if TYPE_CHECKING:
    from rlx.config.schema import RunConfig


@dataclass
class RolloutRole:
    """A rollout server's view of the run."""

    model: ModelConfig
    """The policy model the engine serves."""
    rollout: RolloutConfig
    """The engine, its limits and the sampling defaults."""
    sync: SyncConfig
    """The weight transfer the server receives (its deadline)."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Whether the engine sleeps between turns, and the memory budget of its GPU."""
    seed: int = 0
    """Seed of the engine's sampling (trainer.seed)."""
    lora_sync: str = "none"
    """What a weight sync moves (``RunConfig.lora_sync``): adapter, merged or none."""
    samples_per_step: int = 0
    """trainer.prompts_per_step x rollout.n: what a colocated engine's KV cache is sized to hold at once."""
    run_dir: str = "runs/run"
    """trainer.output_dir: where a server started without --address binds its ipc:// socket."""
    record_routes: bool = False
    """algorithm.routing_replay is record or r3: each sample carries the experts of its tokens (MoE models)."""
    placeholder_weights: bool = False
    """Start the engine with placeholder weights, which the run's first sync replaces: set by the launcher for the
    servers it starts under rollout.engine_weights=first_sync, never for a server started by hand."""

    @property
    def sampling(self) -> SamplingConfig:
        return self.rollout.sampling


@dataclass
class TrainerRole:
    """A trainer rank's view of the run."""

    model: ModelConfig
    """The policy model the rank trains."""
    trainer: TrainerConfig
    """Optimisation, ranks and the step loop."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages, policy loss, KL and rollout correction."""
    store: StoreConfig = field(default_factory=StoreConfig)
    """The sample store ranks > 0 pull their rows from."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoint retention (each rank writes its shard)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """How the samples were drawn: the logprobs divide by its temperature, its groups are n samples."""
    correction: str = "none"
    """The rollout correction in force (``RunConfig.correction``, 'auto' resolved)."""
    lora_sync: str = "none"
    """What a weight sync moves (``RunConfig.lora_sync``): adapter, merged or none."""
    teacher_auth_token: str = ""
    """rollout.auth_token, which a served teacher's requests carry; never written to a role file."""


Role = TypeVar("Role", RolloutRole, TrainerRole)


def rollout_role(cfg: RunConfig) -> RolloutRole:
    return RolloutRole(
        model=cfg.model,
        rollout=cfg.rollout,
        sync=cfg.sync,
        placement=cfg.placement,
        seed=cfg.trainer.seed,
        lora_sync=cfg.lora_sync,
        samples_per_step=cfg.trainer.prompts_per_step * cfg.rollout.n,
        run_dir=cfg.trainer.output_dir,
        record_routes=cfg.algorithm.routing_replay != "off",
    )


def trainer_role(cfg: RunConfig) -> TrainerRole:
    return TrainerRole(
        model=cfg.model,
        trainer=cfg.trainer,
        algorithm=cfg.algorithm,
        store=cfg.store,
        checkpoint=cfg.checkpoint,
        sampling=cfg.sampling,
        correction=cfg.correction,
        lora_sync=cfg.lora_sync,
        teacher_auth_token=cfg.rollout.auth_token,
    )


ROLE_SECRETS = {RolloutRole: ("rollout", "auth_token"), TrainerRole: (None, "teacher_auth_token")}
"""Where each role holds the run's one secret (rollout.auth_token): blanked in its file, read from the environment."""


def write_role(role: RolloutRole | TrainerRole, path: Path) -> Path:
    """``role`` as JSON at ``path``, its secret blanked."""
    import msgspec

    section, name = ROLE_SECRETS[type(role)]
    holder = getattr(role, section) if section else role
    if getattr(holder, name):
        holder = dataclasses.replace(holder, **{name: ""})
        role = dataclasses.replace(role, **{section: holder}) if section else holder
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.format(msgspec.json.encode(role)) + b"\n")
    return path


def read_role(path: str | Path, kind: type[Role], secret: str = "") -> Role:
    """The role file at ``path`` as ``kind``, every section checked again as it is built, with ``secret`` (from the
    environment) put back where the file blanked it."""
    import msgspec

    try:
        role = msgspec.json.decode(Path(path).read_bytes(), type=kind)
    except (OSError, msgspec.DecodeError) as exc:
        raise ConfigError(f"cannot read the {kind.__name__} file {path}: {exc}; `rlx train` writes it") from None
    section, name = ROLE_SECRETS[kind]
    if secret:
        setattr(getattr(role, section) if section else role, name, secret)
    return role
