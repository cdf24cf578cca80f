"""Checks across sections: sizes, layouts and options that are each fine alone and fail together. ``RunConfig``
runs them once every section has checked its own fields."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlx.config.errors import ConfigError
from rlx.config.model import VLLM_MAX_LORA_RANK

if TYPE_CHECKING:
    from rlx.config.schema import RunConfig


def check_lora_sync(cfg: RunConfig) -> None:
    """``model.lora.sync=adapter`` needs an adapter, and on vLLM one of a rank it serves."""
    lora = cfg.model.lora
    if lora.sync == "adapter" and not lora.rank:
        raise ConfigError(
            "model.lora.sync=adapter with model.lora.rank=0: there is no adapter to sync; set "
            "model.lora.rank > 0 or leave model.lora.sync=auto"
        )
    if cfg.lora_sync == "adapter" and cfg.rollout.backend == "vllm" and lora.rank > VLLM_MAX_LORA_RANK:
        raise ConfigError(
            f"model.lora.rank={lora.rank} with model.lora.sync={lora.sync} on rollout.backend=vllm: "
            f"vLLM serves LoRA adapters up to rank {VLLM_MAX_LORA_RANK}; set model.lora.sync=merged "
            "or a smaller model.lora.rank"
        )


def check_colocated(cfg: RunConfig) -> None:
    """placement.mode=colocated: what taking turns rules out, whatever the host's devices."""
    if cfg.placement.mode != "colocated":
        return
    if cfg.trainer.mode != "sync":
        raise ConfigError(
            f"placement.mode=colocated with trainer.mode={cfg.trainer.mode}: colocated roles take turns, "
            "so generation cannot overlap training; set trainer.mode=sync or placement.mode=separate"
        )
    if cfg.rollout.servers:
        raise ConfigError(
            "placement.mode=colocated with rollout.servers: only servers this run launches share the "
            "trainer's GPUs; empty rollout.servers or set placement.mode=separate"
        )
    if cfg.placement.sleep_level == 2 and cfg.lora_sync == "adapter":
        raise ConfigError(
            "placement.sleep_level=2 with model.lora.sync=adapter: a level-2 sleep drops the engine's base weights "
            "and an adapter sync does not bring them back; set placement.sleep_level=1 or model.lora.sync=merged"
        )
    if cfg.placement.offload and cfg.trainer.num_ranks > 1:
        raise ConfigError(
            f"placement.offload with trainer.num_ranks={cfg.trainer.num_ranks}: offloading runs on one "
            "trainer rank; set trainer.num_ranks=1 or placement.offload=false"
        )


def check_sizes(cfg: RunConfig) -> None:
    """Sizes one section sets that another's must hold: each field is fine alone, the pair fails only later."""
    r, f, t = cfg.rollout, cfg.filters, cfg.trainer
    if f.overlong == "soft" and f.overlong_buffer > r.max_tokens:
        raise ConfigError(
            f"filters.overlong_buffer={f.overlong_buffer} is longer than rollout.max_tokens="
            f"{r.max_tokens}: the overlong penalty would start before the first token; set "
            "filters.overlong_buffer to at most rollout.max_tokens"
        )
    rows = t.prompts_per_step * r.n
    if t.num_ranks > 1 and t.data_plane == "store" and cfg.store.max_rows < rows:
        raise ConfigError(
            f"store.max_rows={cfg.store.max_rows} is smaller than one step's batch "
            f"(trainer.prompts_per_step={t.prompts_per_step} x rollout.n={r.n} = {rows} samples), "
            f"which the sample store holds at once; set store.max_rows >= {rows}"
        )


def check_run(cfg: RunConfig) -> None:
    """Every check across sections, in the order a user would fix them."""
    if cfg.launcher == "ray" and cfg.rollout.restart_on_failure:
        raise ConfigError(
            "rollout.restart_on_failure restarts servers started by the local launcher; with "
            "launcher=ray a dead rollout server stops the run: set rollout.restart_on_failure=false "
            "(resume the run with --resume) or use launcher=local"
        )
    check_colocated(cfg)
    if cfg.algorithm.advantage == "gae" and cfg.trainer.num_ranks > 1:
        raise ConfigError(
            f"algorithm.advantage=gae with trainer.num_ranks={cfg.trainer.num_ranks}: the critic "
            "trains on one rank; set trainer.num_ranks=1"
        )
    if cfg.trainer.mode == "fully_async" and (cfg.filters.active or cfg.rollout.dump_dir or cfg.rollout.reuse):
        raise ConfigError(
            "trainer.mode=fully_async trains on prompt groups as they finish and applies no filters.*, "
            "rollout.dump_dir or rollout.reuse; turn those off or use trainer.mode=sync / one_step_off"
        )
    check_lora_sync(cfg)
    if cfg.rollout.engine_weights == "first_sync" and cfg.lora_sync == "adapter":
        raise ConfigError(
            "rollout.engine_weights=first_sync with model.lora.sync=adapter: the sync moves only the adapter, so the "
            "engine would keep its placeholder base weights; set rollout.engine_weights=model or "
            "model.lora.sync=merged"
        )
    check_sizes(cfg)
    if cfg.rollout.host not in ("127.0.0.1", "localhost", "::1") and not cfg.rollout.auth_token:
        raise ConfigError(
            f"rollout.host={cfg.rollout.host!r} is not loopback; set rollout.auth_token to a shared secret "
            "(every request must carry it) or bind 127.0.0.1"
        )
