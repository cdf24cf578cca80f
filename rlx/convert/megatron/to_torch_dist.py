"""Hugging Face (Llama / Qwen2 / Qwen3) -> Megatron-LM torch_dist checkpoint.

The tensors are mapped by ``mapping``, assigned into a meta-device megatron-core GPTModel (which
checks every shape) and saved with megatron's own ``dist_checkpointing.save`` from the model's
``sharded_state_dict()``, so the keys, layer stacking and SwiGLU layout are exactly what
GPTModel loads, under any TP / PP (torch_dist stores global tensors).

Memory: PyTorch's distributed-checkpoint writer takes the whole state dict in one call, so this
direction holds one copy of the weights (in the output dtype) plus megatron's copy of the fused
gate/up weights, about 1.6x the model; ``--dry-run`` prints the estimate.
Left out: optimizer state and RNG (load with ``--finetune --no-load-optim --no-load-rng``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console

from rlx.convert.destination import staged_directory
from rlx.convert.errors import ConvertError
from rlx.convert.hf_job import RunSummary
from rlx.convert.hf_write import copy_model_files, target_dtype
from rlx.convert.megatron.layout import HF_SUBDIR, LATEST_FILE, iter_dir_name
from rlx.convert.megatron.mapping import LOCAL_NORM_NAMES, Rule, all_rules, to_mcore
from rlx.convert.megatron.spec import ModelSpec, read_spec
from rlx.convert.plan import Plan, PlanRow
from rlx.convert.progress import byte_progress
from rlx.convert.safetensors_io import SafetensorsDir

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass
class TorchDistJob:
    src: Path
    template: Path
    source: SafetensorsDir
    spec: ModelSpec
    rules: list[Rule]
    dtype: torch.dtype | None
    iteration: int
    notes: list[str]

    def out_dtype(self, rule: Rule) -> torch.dtype:
        return target_dtype(self.source.tensors[rule.hf[0]].torch_dtype, self.dtype)

    def out_shape(self, rule: Rule) -> tuple[int, ...]:
        shapes = [self.source.tensors[h].shape for h in rule.hf]
        rows = self.spec.padded_vocab_size if rule.kind == "vocab" else sum(s[0] for s in shapes)
        return (rows,) + tuple(shapes[0][1:])

    def plan(self, destination: Path) -> Plan:
        file = f"{iter_dir_name(self.iteration)}/*.distcp"
        rows = []
        for rule in self.rules:
            shape, dtype = self.out_shape(rule), self.out_dtype(rule)
            numel = 1
            for dim in shape:
                numel *= dim
            rows.append(
                PlanRow(rule.mcore, rule.hf, shape, str(dtype).removeprefix("torch."), numel * dtype.itemsize, file)
            )
        # The whole state dict, plus megatron's copy of linear_fc1 (its SwiGLU halves are views it clones).
        peak = sum(r.nbytes for r in rows) + sum(r.nbytes for r in rows if r.name.endswith("linear_fc1.weight"))
        return Plan(
            "Hugging Face -> Megatron torch_dist",
            str(self.src),
            str(destination),
            rows,
            self.source.total_bytes,
            peak,
            list(self.notes),
        )

    def run(self, destination: Path, console: Console | None = None, show_progress: bool = True) -> RunSummary:
        from rlx.convert.megatron import runtime

        start = time.perf_counter()
        with staged_directory(destination) as tmp, runtime.single_process_group():
            state = self._mapped_state(console, show_progress)
            model = runtime.build_gpt_model(self.spec, torch.float32)
            _assign(model, state)
            iter_dir = tmp / iter_dir_name(self.iteration)
            iter_dir.mkdir()
            if console and show_progress:
                console.print(f"saving torch_dist with megatron-core to {destination / iter_dir.name}")
            runtime.save_torch_dist(model.sharded_state_dict(), iter_dir, self.iteration)
            (tmp / LATEST_FILE).write_text(f"{self.iteration}\n")
            (tmp / HF_SUBDIR).mkdir()
            copy_model_files(self.template, tmp / HF_SUBDIR, self.dtype)
            bytes_out = sum(p.stat().st_size for p in iter_dir.iterdir())
        return RunSummary(
            destination,
            sorted(p.name for p in destination.iterdir()),
            self.source.total_bytes,
            bytes_out,
            time.perf_counter() - start,
            list(self.notes),
        )

    def _mapped_state(self, console: Console | None, show_progress: bool) -> dict[str, torch.Tensor]:
        state = {}
        with byte_progress("reading + mapping", self.source.total_bytes, console, show_progress) as advance:
            for rule in self.rules:
                parts = [self.source.read(h) for h in rule.hf]
                state[local_module_name(rule.mcore)] = to_mcore(rule, parts, self.spec).to(self.out_dtype(rule))
                advance(sum(p.numel() * p.element_size() for p in parts))
        return state


def local_module_name(mcore_name: str) -> str:
    """Checkpoint name -> the parameter name in GPTModel built with the local layer spec."""
    for te_suffix, local_suffix in LOCAL_NORM_NAMES.items():
        if mcore_name.endswith(te_suffix):
            return mcore_name[: -len(te_suffix)] + local_suffix
    return mcore_name


def _assign(model, state: dict[str, torch.Tensor]) -> None:
    try:
        result = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:
        raise ConvertError(f"the mapped tensors do not fit megatron-core's GPTModel: {exc}") from None
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
    if missing or result.unexpected_keys:
        raise ConvertError(
            f"mapping mismatch with GPTModel: missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}"
        )


def hf_to_torch_dist_job(
    source: SafetensorsDir, template: Path, dtype: torch.dtype | None, vocab_multiple: int, iteration: int
) -> TorchDistJob:
    """``source``: HF-named weights (an HF directory or a trainer checkpoint); ``template``: its config dir."""
    spec = read_spec(template / "config.json", vocab_multiple)
    rules = all_rules(spec)
    notes = _check_names(source, rules, spec)
    if spec.padded_vocab_size != spec.vocab_size:
        notes.append(
            f"vocabulary padded from {spec.vocab_size} to {spec.padded_vocab_size} rows "
            f"(--vocab-multiple {vocab_multiple}); padding rows are zero"
        )
    return TorchDistJob(source.path, template, source, spec, rules, dtype, iteration, notes)


def _check_names(source: SafetensorsDir, rules: list[Rule], spec: ModelSpec) -> list[str]:
    needed = {h for rule in rules for h in rule.hf}
    missing = sorted(needed - set(source.tensors))
    if missing:
        raise ConvertError(
            f"{source.path} has no tensor {missing[0]!r} (and {len(missing) - 1} more) that a "
            f"{spec.family} model with this config.json needs; is config.json from this checkpoint?"
        )
    extra = sorted(n for n in set(source.tensors) - needed if not n.endswith(_IGNORED_SUFFIXES))
    notes = []
    if spec.tie_word_embeddings and "lm_head.weight" in extra:
        extra.remove("lm_head.weight")
        notes.append("lm_head.weight not written: embeddings are tied (tie_word_embeddings=true)")
    if extra:
        raise ConvertError(
            f"{source.path} has tensors the {spec.family} mapping does not know: {extra[:5]}; "
            "this is not a plain Llama / Qwen2 / Qwen3 checkpoint"
        )
    return notes
