"""Megatron-LM torch_dist checkpoint -> Hugging Face (Llama / Qwen2 / Qwen3).

Reads one layer at a time with megatron's ``dist_checkpointing.load`` (a ShardedTensor per
tensor of that layer, at its offset in the layer-stacked global tensor), so memory stays at one
layer whatever the model size and whatever TP / PP wrote the checkpoint. The Hugging Face
config and tokenizer come from ``--hf-config`` or the ``hf/`` folder rlx writes beside the
iterations. Left out: optimizer state, non-homogeneous (per-layer key) checkpoints.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from rlx.convert.errors import ConvertError
from rlx.convert.hf_job import HFJob
from rlx.convert.hf_write import target_dtype
from rlx.convert.megatron.layout import default_hf_template, resolve_iter_dir
from rlx.convert.megatron.mapping import Rule, all_rules, hf_shape, to_hf
from rlx.convert.megatron.spec import ModelSpec, read_spec
from rlx.convert.safetensors_writer import OutTensor

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def stacked_key(mcore_name: str) -> tuple[str, int | None]:
    """'decoder.layers.3.mlp.linear_fc2.weight' -> ('decoder.layers.mlp.linear_fc2.weight', 3)."""
    match = _LAYER.match(mcore_name)
    if match:
        return f"decoder.layers.{match.group(2)}", int(match.group(1))
    return mcore_name, None


class LayerReader:
    """Loads the tensors of one layer (or one top-level tensor) per call and keeps the last group."""

    def __init__(self, iter_dir: Path, metadata: dict, spec: ModelSpec, rules: list[Rule]):
        self.iter_dir, self.metadata, self.spec = iter_dir, metadata, spec
        self.groups: dict[object, list[Rule]] = {}
        for rule in rules:
            key, layer = stacked_key(rule.mcore)
            self.groups.setdefault(layer if layer is not None else rule.mcore, []).append(rule)
        self._cached_group: object = None
        self._cache: dict[str, torch.Tensor] = {}

    def mcore_shape(self, rule: Rule) -> tuple[int, ...]:
        key, layer = stacked_key(rule.mcore)
        shape = tuple(self.metadata[key].global_shape)
        return shape[1:] if layer is not None else shape

    def dtype(self, rule: Rule) -> torch.dtype:
        return self.metadata[stacked_key(rule.mcore)[0]].dtype

    def hf_tensor(self, rule: Rule, index: int) -> torch.Tensor:
        group = stacked_key(rule.mcore)[1]
        group = group if group is not None else rule.mcore
        if group != self._cached_group:
            self._cache = self._load_group(self.groups[group])
            self._cached_group = group
        return self._cache[rule.hf[index]]

    def _load_group(self, rules: list[Rule]) -> dict[str, torch.Tensor]:
        from megatron.core.dist_checkpointing import ShardedTensor

        from rlx.convert.megatron import runtime

        # A layer is requested as a [1, ...] slab at its offset of the stacked tensor (not with
        # prepend_axis_num, whose legacy path cannot load part of a tensor in a world of one rank).
        request = {}
        for rule in rules:
            key, layer = stacked_key(rule.mcore)
            if layer is None:
                empty = torch.empty(self.mcore_shape(rule), dtype=self.dtype(rule))
                request[rule.mcore] = ShardedTensor.from_rank_offsets(key, empty)
            else:
                empty = torch.empty((1,) + self.mcore_shape(rule), dtype=self.dtype(rule))
                request[rule.mcore] = ShardedTensor.from_rank_offsets(key, empty, (0, layer, self.spec.num_layers))
        with runtime.single_process_group():
            loaded = runtime.load_tensors(request, self.iter_dir)
        out = {}
        for rule in rules:
            tensor = loaded[rule.mcore]
            tensor = tensor[0] if stacked_key(rule.mcore)[1] is not None else tensor
            out.update(zip(rule.hf, to_hf(rule, tensor, self.spec), strict=True))
        return out


def torch_dist_to_hf_job(
    src: Path,
    hf_config: Path | None,
    iteration: int | None,
    dtype: torch.dtype | None,
    shard_bytes: int,
    vocab_multiple: int,
) -> HFJob:
    from rlx.convert.megatron import runtime

    iter_dir = resolve_iter_dir(src, iteration)
    template = hf_config or default_hf_template(src, iter_dir)
    if template is None:
        raise ConvertError(
            f"{src} has no hf/ folder with the model's config and tokenizer; pass --hf-config "
            "DIR (the Hugging Face directory of the same model)"
        )
    spec = read_spec(template / "config.json", vocab_multiple)
    metadata = runtime.tensors_metadata(iter_dir)
    rules = all_rules(spec)
    _check_keys(rules, metadata, iter_dir, spec)
    reader = LayerReader(iter_dir, metadata, spec, rules)
    tensors = [_out_tensor(reader, rule, i, dtype) for rule in rules for i in range(len(rule.hf))]
    layer_bytes = max(sum(_nbytes(reader, r) for r in group) for group in reader.groups.values())
    bytes_in = sum(_nbytes(reader, rule) for rule in rules)
    return HFJob(
        "Megatron torch_dist -> Hugging Face",
        str(iter_dir),
        template,
        tensors,
        bytes_in,
        shard_bytes,
        dtype,
        3 * layer_bytes,
        workers=1,
        context=runtime.single_process_group,
    )


def _out_tensor(reader: LayerReader, rule: Rule, index: int, dtype: torch.dtype | None) -> OutTensor:
    to = target_dtype(reader.dtype(rule), dtype)
    shape = hf_shape(rule, index, reader.mcore_shape(rule), reader.spec)
    return OutTensor(rule.hf[index], to, shape, lambda: [reader.hf_tensor(rule, index).to(to)], (rule.mcore,))


def _nbytes(reader: LayerReader, rule: Rule) -> int:
    numel = 1
    for dim in reader.mcore_shape(rule):
        numel *= dim
    return numel * reader.dtype(rule).itemsize


def _check_keys(rules: list[Rule], metadata: dict, iter_dir: Path, spec: ModelSpec) -> None:
    for rule in rules:
        key, layer = stacked_key(rule.mcore)
        if key not in metadata:
            known = sorted(metadata)[:6]
            raise ConvertError(
                f"{iter_dir} has no tensor {key!r}, which a {spec.family} model with the given "
                f"config needs (it holds e.g. {known}); is --hf-config the right model?"
            )
        shape = tuple(metadata[key].global_shape)
        if layer is not None and shape[0] != spec.num_layers:
            raise ConvertError(
                f"{key} stacks {shape[0]} layers but config.json says num_hidden_layers="
                f"{spec.num_layers}; --hf-config does not belong to this checkpoint"
            )
        if rule.kind == "vocab" and shape[0] < spec.vocab_size:
            raise ConvertError(f"{key} has {shape[0]} rows, fewer than vocab_size={spec.vocab_size}")
