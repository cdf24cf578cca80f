"""Which tensors an FP8 conversion quantizes, and why the others stay as they are.

Only 2-D floating-point ``*.weight`` tensors of linear layers are quantized. Kept, with the
reason in the report: norms and biases (not 2-D), embeddings, lm_head / Megatron output layer,
MoE routers and shared-expert gates (small, and routing is sensitive to them), vision towers
and projectors, and every tensor matching a ``--skip`` glob (matched against the tensor name
and its module name, e.g. ``--skip 'model.layers.0.*'``).
"""

from __future__ import annotations

import fnmatch
import re

from rlx.convert.safetensors_io import TensorInfo

_RULES = (
    ("embedding", re.compile(r"(^|\.)(embed_tokens|word_embeddings|wte|wpe|embed_positions|embeddings)\.")),
    ("lm_head", re.compile(r"(^|\.)(lm_head|output_layer)\.")),
    ("norm", re.compile(r"norm[^.]*\.weight$")),
    ("MoE router / gate", re.compile(r"(\.gate\.weight$|\.router\.|shared_expert_gate\.)")),
    (
        "vision tower",
        re.compile(
            r"(^|\.)(visual|vision_tower|vision_model|vision_encoder|multi_modal_projector"
            r"|mm_projector|image_newline)\."
        ),
    ),
)


def module_name(tensor_name: str) -> str:
    return tensor_name.rsplit(".", 1)[0]


def keep_reason(info: TensorInfo, skip_patterns: list[str]) -> str | None:
    """None when the tensor is quantized, else why it stays in its dtype."""
    if not info.name.endswith(".weight") or len(info.shape) != 2:
        return "not a 2-D weight"
    if 0 in info.shape:
        return "empty"
    if not info.torch_dtype.is_floating_point:
        return "not floating point"
    for pattern in skip_patterns:
        if fnmatch.fnmatchcase(info.name, pattern) or fnmatch.fnmatchcase(module_name(info.name), pattern):
            return f"--skip {pattern}"
    for reason, regex in _RULES:
        if regex.search(info.name):
            return reason
    return None
