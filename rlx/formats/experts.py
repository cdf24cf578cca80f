"""Mixture-of-experts weights: transformers' fused expert tensors and the checkpoint's one tensor per expert.

transformers (5.x) holds a sparse layer's experts as two 3-D parameters, ``mlp.experts.gate_up_proj``
``[experts, 2 * width, hidden]`` (each expert's gate rows, then its up rows) and ``mlp.experts.down_proj``
``[experts, hidden, width]``; it splits them again when it saves. Checkpoints, and vLLM's ``load_weights``
for Qwen3-MoE and OLMoE, take one tensor per expert: ``mlp.experts.{e}.gate_proj.weight``, ``up_proj`` and
``down_proj``. ``per_expert`` turns a trainer's named parameter into those (views, no copy), so a weight sync
carries the checkpoint's names and layout; ``expert_views`` gives a receiver that holds the fused tensors
(the hf backend) a view of each per-expert name to copy into. Families that rename the block (Mixtral's
``block_sparse_moe``, ``w1``/``w3``/``w2``) are left out: ``per_expert`` refuses a fused tensor it does not know.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

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
