"""What ``trainer.backend=megatron`` needs before a run starts (called by ``rlx.trainer.preflight.check_trainer``).

The parallel sizes against the model's config.json (attention heads and query groups by the tensor-parallel size,
layers by the pipeline stages; the vocabulary is padded to a multiple of TP, so any size goes) and against
``trainer.num_ranks``; then each feature this backend does not run yet, refused with the key that turns it off.
The vocabulary's padding and the refusals' reasons are in docs/train.md ("Megatron backend").
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.config.errors import ConfigError

if TYPE_CHECKING:
    from rlx.config.roles import TrainerRole

INSTALL_HINT = "pip install -e '.[megatron]'"


def check_megatron(role: TrainerRole) -> str:
    """Refuse a layout the model cannot be split by, or a feature this backend leaves out; else the layout in words
    (``rlx doctor``'s trainer row), e.g. 'megatron-core GPTModel, local layer spec, TP=2 PP=1 CP=1 DP=1'."""
    try:
        found = importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(
            f"trainer.backend=megatron needs megatron-core, which is not installed; run `{INSTALL_HINT}` "
            "(or set trainer.backend=fsdp2)"
        )
    check_layout(role)
    check_features(role)
    from rlx.trainer.megatron.build import layer_spec_name

    m = role.trainer.megatron
    dp = role.trainer.num_ranks // m.model_parallel
    layout = f"TP={m.tensor_parallel} PP={m.pipeline_parallel} CP={m.context_parallel} DP={dp}"
    return f"megatron-core GPTModel, {layer_spec_name()} layer spec, {layout}"


def check_layout(role: TrainerRole) -> None:
    from rlx.convert.errors import ConvertError
    from rlx.convert.megatron.spec import read_spec

    m, ranks = role.trainer.megatron, role.trainer.num_ranks
    try:
        spec = read_spec(Path(role.model.path) / "config.json", m.tensor_parallel)
    except ConvertError as exc:
        raise ConfigError(f"trainer.backend=megatron cannot build model.path={role.model.path!r}: {exc}") from None
    tp = m.tensor_parallel
    for what, count in (("num_attention_heads", spec.num_heads), ("num_key_value_heads", spec.num_kv_heads)):
        if count % tp:
            raise ConfigError(
                f"trainer.megatron.tensor_parallel={tp} does not divide the model's {what}={count}; set "
                f"trainer.megatron.tensor_parallel to a divisor of {count}"
            )
    if spec.num_layers % m.pipeline_parallel:
        raise ConfigError(
            f"trainer.megatron.pipeline_parallel={m.pipeline_parallel} does not divide the model's "
            f"num_hidden_layers={spec.num_layers}; set it to a divisor of {spec.num_layers}"
        )
    if ranks % m.model_parallel:
        raise ConfigError(
            f"trainer.num_ranks={ranks} is not a multiple of tensor x pipeline x context parallel = "
            f"{tp} x {m.pipeline_parallel} x {m.context_parallel} = {m.model_parallel}; set trainer.num_ranks to a "
            "multiple of it (the data-parallel size is what is left)"
        )


def check_features(role: TrainerRole) -> None:
    t, m, a, model = role.trainer, role.trainer.megatron, role.algorithm, role.model
    refused = [
        (
            m.pipeline_parallel > 1,
            f"trainer.megatron.pipeline_parallel={m.pipeline_parallel}: the update does not run through "
            "megatron-core's pipeline schedule yet (and on a CPU that schedule allocates on CUDA); set "
            "trainer.megatron.pipeline_parallel=1",
        ),
        (
            m.context_parallel > 1,
            f"trainer.megatron.context_parallel={m.context_parallel} is not supported yet; set "
            "trainer.megatron.context_parallel=1",
        ),
        (
            m.distributed_optimizer,
            "trainer.megatron.distributed_optimizer=true is not supported yet (each rank keeps AdamW's state of its "
            "own shards); set trainer.megatron.distributed_optimizer=false",
        ),
        (model.lora.rank > 0, "model.lora.rank > 0: LoRA is not supported yet; set model.lora.rank=0"),
        (
            a.advantage == "gae",
            "algorithm.advantage=gae needs a critic, which trainer.backend=megatron does not build yet; set "
            "algorithm.advantage=grpo (or another critic-free estimator)",
        ),
        (
            a.kl_coef > 0,
            f"algorithm.kl_coef={a.kl_coef} needs a reference model, which trainer.backend=megatron does not build "
            "yet; set algorithm.kl_coef=0",
        ),
        (
            bool(a.distill.teacher),
            "algorithm.distill.teacher: distillation is not supported yet; unset algorithm.distill.teacher",
        ),
        (
            model.compute_dtype not in ("auto", model.dtype),
            f"model.compute_dtype={model.compute_dtype} with model.dtype={model.dtype}: this backend computes in "
            "model.dtype; set model.compute_dtype=auto",
        ),
        (
            model.gradient_checkpointing,
            "model.gradient_checkpointing=true is not wired into this backend yet; set "
            "model.gradient_checkpointing=false",
        ),
        (
            t.fused_kernels == "on",
            "trainer.fused_kernels=on: the fused kernels patch transformers models; set trainer.fused_kernels=auto",
        ),
    ]
    for bad, message in refused:
        if bad:
            raise ConfigError(f"trainer.backend=megatron: {message}")
