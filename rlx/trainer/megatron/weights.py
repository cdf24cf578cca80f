"""Weights between Hugging Face and this rank's megatron-core GPTModel, through ``rlx.convert.megatron.mapping``.

- ``load_hf_weights``: each parameter of the rank's model from the safetensors of ``model.path``: the mapping's
  rule makes the full megatron tensor (q/k/v fused per query group, gate and up stacked, the vocabulary padded),
  and the rank keeps its tensor-parallel cut (the gate and the up halves cut each, as megatron lays out SwiGLU).
- ``hf_named_tensors``: the way back for a weight sync: every rank gathers its tensor-parallel group's cuts, the
  mapping undoes the fused layouts and the padding, and each tensor comes out under its Hugging Face name, whole,
  on every rank (with pipeline stages, broadcast from the stage that holds it). A tied head is the embedding's
  tensor, which the engine's loader ties itself, as in the FSDP2 backend's sync. On one rank in the engine's
  dtype every tensor is a view of a parameter but q, k and v, which the split writes into memory the caller
  gives (``qkv_scratch``: the sync's weight arena), so the sync copies nothing more than the split.

A parameter's tensor-parallel cut is read from megatron's own attributes on it (``tensor_model_parallel``,
``partition_dim``). Names: the mapping's rules carry Transformer-Engine names (the norms folded into the next
linear layer); the local layer spec's two norm modules are renamed (``LOCAL_NORM_NAMES``).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist

from rlx.convert.megatron.mapping import (
    LOCAL_NORM_NAMES,
    Rule,
    all_rules,
    hf_shape,
    split_qkv_into,
    to_hf,
    to_mcore,
)
from rlx.convert.megatron.spec import ModelSpec

LAYER_PREFIX = "decoder.layers."


def global_name(name: str, model) -> str:
    """The mapping's (TE, model-wide) name of a parameter of this stage's ``model``."""
    if name.startswith(LAYER_PREFIX):
        local, rest = name[len(LAYER_PREFIX) :].split(".", 1)
        number = model.decoder.layers[int(local)].layer_number  # 1-based over the whole model
        for te_name, local_name in LOCAL_NORM_NAMES.items():
            if rest == local_name:
                rest = te_name
        name = f"{LAYER_PREFIX}{number - 1}.{rest}"
    return name


def stage_rules(model, spec: ModelSpec) -> list[tuple[str, torch.nn.Parameter, Rule]]:
    """(parameter name, parameter, rule) for every parameter of this stage; an error names one no rule covers."""
    rules = {rule.mcore: rule for rule in all_rules(spec)}
    if spec.tie_word_embeddings:  # a last stage without the embedding holds the tied head as output_layer
        rules["output_layer.weight"] = Rule("output_layer.weight", ("model.embed_tokens.weight",), "vocab")
    out = []
    for name, param in model.named_parameters():
        rule = rules.get(global_name(name, model))
        if rule is None:
            raise ValueError(f"megatron parameter {name} has no Hugging Face rule in rlx.convert.megatron.mapping")
        out.append((name, param, rule))
    return out


def partition_dim(full_shape: tuple, shape: tuple, tp: int) -> int | None:
    """The dimension a parameter of ``shape`` cuts its full tensor along over ``tp`` ranks (None: replicated).
    Read from the shapes: megatron sets ``partition_dim`` on a parameter only when it initialises it."""
    cut = [d for d, (a, b) in enumerate(zip(full_shape, shape, strict=True)) if a != b]
    if not cut:
        return None
    if len(cut) > 1 or full_shape[cut[0]] != shape[cut[0]] * tp:
        raise ValueError(f"a parameter of shape {tuple(shape)} is no tensor-parallel cut of {tuple(full_shape)}")
    return cut[0]


def _cut(full: torch.Tensor, dim: int | None, rule: Rule, tp: int, tp_rank: int) -> torch.Tensor:
    if dim is None:
        return full
    if rule.kind == "gate_up":
        return torch.cat([half.chunk(tp, dim=dim)[tp_rank] for half in full.chunk(2, dim=0)], dim=0)
    return full.chunk(tp, dim=dim)[tp_rank]


def _joined(shards: list[torch.Tensor], dim: int, rule: Rule) -> torch.Tensor:
    if rule.kind == "gate_up":
        halves = [shard.chunk(2, dim=0) for shard in shards]
        return torch.cat([torch.cat([h[0] for h in halves], dim=dim), torch.cat([h[1] for h in halves], dim=dim)])
    return torch.cat(shards, dim=dim)


@torch.no_grad()
def load_hf_weights(model, spec: ModelSpec, model_path: str, tp: int, tp_rank: int) -> dict[str, int | None]:
    """Fill every parameter of ``model`` from the safetensors of ``model_path`` (this rank's cut of each).
    Returns each parameter's tensor-parallel dimension (None: the same on every rank of the group)."""
    from rlx.convert.safetensors_io import SafetensorsDir

    source, dims = SafetensorsDir(model_path), {}
    for name, param, rule in stage_rules(model, spec):
        missing = [h for h in rule.hf if h not in source.tensors]
        if missing:
            raise ValueError(f"{model_path} has no tensor {missing[0]} (megatron's {name} is made of {rule.hf})")
        full = to_mcore(rule, [source.read(h) for h in rule.hf], spec)
        try:
            dims[name] = partition_dim(tuple(full.shape), tuple(param.shape), tp)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}; {model_path}'s config.json does not describe its weights") from None
        param.copy_(_cut(full, dims[name], rule, tp, tp_rank))
    return dims


def _gathered(param, dim: int | None, rule: Rule, tp: int, group) -> torch.Tensor:
    tensor = param.detach()
    if dim is None:
        return tensor
    shards = [torch.empty_like(tensor) for _ in range(tp)]
    dist.all_gather(shards, tensor.contiguous(), group=group)
    return _joined(shards, dim, rule)


def qkv_scratch(model, spec: ModelSpec) -> dict[str, list[tuple[tuple[int, ...], torch.dtype]]]:
    """For each fused q/k/v parameter of ``model`` (by its mapping name), the shapes and dtype of the three
    Hugging Face tensors a sync splits it into: what ``hf_named_tensors`` can write into memory given to it."""
    out = {}
    for name, param, rule in stage_rules(model, spec):
        if rule.kind == "qkv":
            shapes = [hf_shape(rule, i, tuple(param.shape), spec) for i in range(len(rule.hf))]
            out[global_name(name, model)] = [(shape, param.dtype) for shape in shapes]
    return out


@torch.no_grad()
def hf_named_tensors(
    model,
    spec: ModelSpec,
    layout,
    dims: dict,
    hf_shapes: dict,
    dtype: torch.dtype | None = None,
    scratch: dict[str, list[torch.Tensor]] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, full tensor) of the whole model on every rank; a collective (every rank iterates to
    the end). ``dims``: what ``load_hf_weights`` returned; ``hf_shapes``: each Hugging Face tensor's shape, for
    the ranks that receive it from another stage. One stage: ``dtype`` casts each tensor before the fused
    layouts are undone (the split then copies the smaller tensor), and a fused q/k/v with tensors in
    ``scratch`` (``qkv_scratch``'s shapes, in the parameters' dtype) is split into those."""
    from megatron.core import parallel_state as ps

    tp_group = ps.get_tensor_model_parallel_group() if layout.tp > 1 else None
    held = {}
    for name, param, _rule in stage_rules(model, spec):
        if name == "output_layer.weight" and spec.tie_word_embeddings:
            continue  # the tied head: the embedding's tensor, sent once under its name
        held[global_name(name, model)] = (param, dims[name])
    for rule in all_rules(spec):
        if layout.pp == 1:
            param, dim = held[rule.mcore]
            full = _gathered(param, dim, rule, layout.tp, tp_group)
            if scratch and rule.mcore in scratch and (dtype is None or dtype == full.dtype):
                parts = split_qkv_into(full, spec, scratch[rule.mcore])
            else:
                parts = to_hf(rule, full if dtype is None else full.to(dtype), spec)
            yield from zip(rule.hf, parts, strict=True)
            continue
        yield from _from_stage(rule, held, spec, layout, hf_shapes, tp_group)


def _from_stage(rule: Rule, held: dict, spec: ModelSpec, layout, hf_shapes: dict, tp_group):
    """The rule's Hugging Face tensors, broadcast over the pipeline group from the stage that holds them."""
    from megatron.core import parallel_state as ps

    owner = torch.tensor([layout.pp_rank if rule.mcore in held else -1])
    dist.all_reduce(owner, op=dist.ReduceOp.MAX, group=ps.get_pipeline_model_parallel_group())
    source = dist.get_global_rank(ps.get_pipeline_model_parallel_group(), int(owner))
    if rule.mcore in held:
        param, dim = held[rule.mcore]
        tensors = [t.contiguous() for t in to_hf(rule, _gathered(param, dim, rule, layout.tp, tp_group), spec)]
    else:
        dtype = next(p for p, _ in held.values()).dtype
        tensors = [torch.empty(hf_shapes[h], dtype=dtype) for h in rule.hf]
    for name, tensor in zip(rule.hf, tensors, strict=True):
        dist.broadcast(tensor, source, group=ps.get_pipeline_model_parallel_group())
        yield name, tensor
