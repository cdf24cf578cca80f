"""Mixture-of-experts weights: transformers' fused expert tensors and the checkpoint's one tensor per expert.

transformers (5.x) holds a sparse layer's experts as two 3-D parameters, ``mlp.experts.gate_up_proj``
``[experts, 2 * width, hidden]`` (each expert's gate rows, then its up rows) and ``mlp.experts.down_proj``
``[experts, hidden, width]``; it splits them again when it saves. Checkpoints, and vLLM's ``load_weights``
for Qwen3-MoE and OLMoE, take one tensor per expert: ``mlp.experts.{e}.gate_proj.weight``, ``up_proj`` and
``down_proj``. ``per_expert`` turns a trainer's named parameter into those (views, no copy), so a weight sync
carries the checkpoint's names and layout; ``expert_views`` gives a receiver that holds the fused tensors
(the hf backend) a view of each per-expert name to copy into. Families that rename the block (Mixtral's
``block_sparse_moe``, ``w1``/``w3``/``w2``) are left out: ``per_expert`` refuses a fused tensor it does not know.

The routers: ``moe_experts`` reads a config's expert counts, ``routers`` finds the top-k routers of a model in
layer order, ``record_routes`` keeps each router's choices over one forward (the hf backend's route recording;
the trainer's replay is ``rlx.trainer.moe``), and ``route_dtype`` is the small integer a route is stored in.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PretrainedConfig

GATE_UP = ".mlp.experts.gate_up_proj"
DOWN = ".mlp.experts.down_proj"


def is_fused_expert(name: str) -> bool:
    return name.endswith((GATE_UP, DOWN))


def expert_parts(name: str, shape) -> list[tuple[str, int, slice]]:
    """``(checkpoint name, expert, rows of that expert)`` of each per-expert tensor in the fused tensor ``name``
    of ``shape``; empty for a tensor that is not a fused expert tensor."""
    if name.endswith(GATE_UP):
        prefix, width = name[: -len("gate_up_proj")], shape[1] // 2
        kinds = (("gate_proj", slice(0, width)), ("up_proj", slice(width, 2 * width)))
    elif name.endswith(DOWN):
        prefix, kinds = name[: -len("down_proj")], (("down_proj", slice(None)),)
    elif ".experts." in name and name.rsplit(".", 1)[-1] in ("gate_up_proj", "down_proj", "w13_weight", "w2_weight"):
        raise ValueError(
            f"{name!r} is a fused expert tensor of a layout rlx does not split (it knows {GATE_UP} and {DOWN}); "
            "this model family's weight sync and conversion are not supported"
        )
    else:
        return []
    return [(f"{prefix}{e}.{kind}.weight", e, rows) for e in range(shape[0]) for kind, rows in kinds]


def per_expert(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` as the checkpoint holds it: one ``(name, view)`` per expert for a fused expert tensor,
    else the pair itself."""
    parts = expert_parts(name, tensor.shape)
    if not parts:
        yield name, tensor
    for part_name, expert, rows in parts:
        yield part_name, tensor[expert, rows]


def expert_views(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert names -> views into the fused parameters of ``named`` (a model's named parameters)."""
    views = {}
    for name, tensor in named.items():
        if is_fused_expert(name):
            views.update(per_expert(name, tensor))
    return views


def moe_experts(model_config: dict | PretrainedConfig) -> tuple[int, int]:
    """``(experts, experts per token)`` of a transformers model config (or its dict); (0, 0) for a dense model."""
    config = model_config if isinstance(model_config, dict) else model_config.to_dict()
    get = config.get
    experts = int(get("num_experts") or get("num_local_experts") or 0)
    return experts, int(get("num_experts_per_tok") or 0) if experts else 0


def route_dtype(num_experts: int) -> torch.dtype:
    """uint8 for up to 256 experts, else int16: a route costs layers x top_k of these per token."""
    return torch.uint8 if num_experts <= 256 else torch.int16


def routers(model) -> list[torch.nn.Module]:
    """The top-k routers of ``model`` in layer order (``mlp.gate`` modules with ``top_k`` and a ``weight``):
    empty for a dense model, or a router layout rlx leaves out."""
    return [
        module
        for name, module in model.named_modules()
        if name.endswith("mlp.gate")
        and hasattr(module, "top_k")
        and isinstance(getattr(module, "weight", None), torch.Tensor)
    ]


def record_routes(model, forward) -> list[torch.Tensor]:
    """Run ``forward()`` and return each router's top-k experts of the tokens it saw, [N, top_k] per layer in
    layer order (N in the order the router saw them: a padded batch row-major)."""
    found = routers(model)
    recorded: list[torch.Tensor] = [torch.empty(0)] * len(found)

    def keeper(layer: int):
        def keep(module, args, output):
            recorded[layer] = output[2].detach()

        return keep

    handles = [router.register_forward_hook(keeper(layer)) for layer, router in enumerate(found)]
    try:
        forward()
    finally:
        for handle in handles:
            handle.remove()
    return recorded
