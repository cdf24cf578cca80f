"""The FP8 conversion: plan, then read, quantize and write every tensor in parallel tasks.

Building the job reads only headers and config.json: it decides, per source tensor, whether it
is quantized (its FP8 tensor and its scale follow it in the output shard of the same name) or
kept, checks the TP rules, and lays out the output shards, whose headers therefore exist before
any data is read. ``run`` writes those headers, then hands the shards' tasks (``tasks``) to a
thread pool (``parallel``): each task reads a block of rows, quantizes it and writes it in
place, so reading, quantizing and writing overlap and every core works. Memory is a few blocks
of rows per thread, never a tensor or a shard.

Left out: the arithmetic (``quantize``), what is skipped (``policy``), TP rules (``tp_check``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console

from rlx.convert.destination import staged_directory
from rlx.convert.errors import ConvertError
from rlx.convert.fp8 import quantize as fq
from rlx.convert.fp8.parallel import default_workers, run_tasks
from rlx.convert.fp8.policy import keep_reason, module_name
from rlx.convert.fp8.qconfig import quantization_config, scale_suffix
from rlx.convert.fp8.report import Fp8Report, TensorStats
from rlx.convert.fp8.tasks import Task, copy_tasks, row_step, weight_tasks
from rlx.convert.fp8.tp_check import check_all
from rlx.convert.hf_write import copy_model_files, read_model_config
from rlx.convert.memory import release_freed_buffers
from rlx.convert.plan import Plan, PlanRow
from rlx.convert.progress import byte_progress
from rlx.convert.safetensors_io import INDEX_NAME, SafetensorsDir
from rlx.convert.safetensors_writer import OutTensor, Shard, ShardFile, write_index

TASK_MEMORY_FACTOR = 6
"""A running task holds about this many float32 copies of its rows (read, |w|, w/s, decoded |q|, ...)."""


@dataclass
class Fp8Options:
    strategy: str = "block"
    block: tuple[int, int] = (128, 128)
    skip: list[str] = field(default_factory=list)
    tp: int = 1
    workers: int = field(default_factory=default_workers)


@dataclass
class Fp8Job:
    src: Path
    source: SafetensorsDir
    options: Fp8Options
    shards: list[Shard]
    weights: dict[str, TensorStats]
    """Quantized source weights and the dequantization error each one accumulates."""
    kept: list[tuple[str, str]]
    config: dict

    @property
    def ignored_modules(self) -> list[str]:
        """Modules whose weight stays in high precision (matrices only; norms are not linear layers)."""
        kept = [n for n, _ in self.kept if n.endswith(".weight") and len(self.source.tensors[n].shape) >= 2]
        return sorted({"lm_head", *(module_name(n) for n in kept)})

    def plan(self, destination: Path) -> Plan:
        rows = [
            PlanRow(t.name, t.sources, t.shape, str(t.dtype).removeprefix("torch."), t.nbytes, s.file_name)
            for s in self.shards
            for t in s.tensors
        ]
        notes = [
            f"kept in {self.source.tensors[n].dtype}: {n} ({why})" for n, why in self.kept if why != "not a 2-D weight"
        ]
        notes.append(f"{sum(1 for _, why in self.kept if why == 'not a 2-D weight')} norms / biases / 1-D tensors kept")
        return Plan(
            f"FP8 ({self.options.strategy}) conversion",
            str(self.src),
            str(destination),
            rows,
            self.source.total_bytes,
            self._peak_task_bytes() * self.options.workers,
            notes,
        )

    def run(self, destination: Path, console: Console | None = None, show_progress: bool = True) -> Fp8Report:
        start = time.perf_counter()
        release_freed_buffers()
        bytes_out = sum(s.nbytes for s in self.shards)
        with staged_directory(destination) as tmp:
            copy_model_files(self.src, tmp, None)
            self._write_config(tmp / "config.json")
            files = [ShardFile(tmp / s.file_name, s, {"format": "pt"}) for s in self.shards]
            try:
                with byte_progress("quantizing", bytes_out, console, show_progress) as advance:
                    groups = ((f, self._tasks(s, f)) for s, f in zip(self.shards, files, strict=True))
                    run_tasks(groups, self.options.workers, advance)
            finally:
                for f in files:
                    f.abort()
            if (self.src / INDEX_NAME).is_file() or len(self.shards) > 1:
                write_index(tmp, self.shards, force=True)
        file_bytes = sum(p.stat().st_size for p in destination.glob("*.safetensors"))
        in_bytes = sum(p.stat().st_size for p in self.source.files)
        return Fp8Report(
            str(destination),
            self.options.strategy,
            self.options.block,
            list(self.weights.values()),
            self.kept,
            in_bytes,
            file_bytes,
            time.perf_counter() - start,
        )

    def _tasks(self, shard: Shard, out: ShardFile) -> list[Task]:
        tasks: list[Task] = []
        strategy, block = self.options.strategy, self.options.block
        for tensor in shard.tensors:
            info = self.source.tensors.get(tensor.name)
            if info is None:  # a scale: written by its weight's tasks
                continue
            if tensor.name in self.weights:
                scale_name = tensor.name[: -len(".weight")] + scale_suffix(strategy)
                tasks += weight_tasks(self.source, info, out, scale_name, strategy, block, self.weights[tensor.name])
            else:
                tasks += copy_tasks(self.source, info, out)
        return tasks

    def _peak_task_bytes(self) -> int:
        multiple = self.options.block[0] if self.options.strategy == "block" else 1
        infos = [self.source.tensors[name] for name in self.weights]
        return TASK_MEMORY_FACTOR * max((row_step(i, 4, multiple) * i.shape[1] * 4 for i in infos), default=0)

    def _write_config(self, path: Path) -> None:
        config = dict(self.config)
        config["quantization_config"] = quantization_config(
            self.options.strategy, self.options.block, self.ignored_modules
        )
        path.write_text(json.dumps(config, indent=2) + "\n")


def fp8_job(src: Path, options: Fp8Options) -> Fp8Job:
    _check_options(options)
    source = SafetensorsDir(src)
    config = _read_config(src)
    _refuse_fp8_input(src, source, config)
    kept, quantized = [], []
    for name, info in source.tensors.items():
        reason = keep_reason(info, options.skip)
        if reason:
            kept.append((name, reason))
        else:
            quantized.append(info)
    shapes = {i.name: i.shape for i in quantized}
    problems = check_all(shapes, options.tp, options.strategy, options.block, config)
    if problems:
        raise ConvertError(_tp_message(problems, options, _block_that_fits(shapes, options, config)))
    weights = {info.name: TensorStats(info.name) for info in quantized}
    shards = [_shard(source, f, weights, options) for f in source.files]
    return Fp8Job(src, source, options, shards, weights, kept, config)


def _shard(source: SafetensorsDir, file: Path, weights: dict[str, TensorStats], options: Fp8Options) -> Shard:
    """The output shard of one source file: its tensors in file order, each scale after its weight."""
    shard = Shard(file.name)
    for info in sorted((i for i in source.tensors.values() if i.file == file), key=lambda i: i.start):
        if info.name not in weights:
            shard.tensors.append(OutTensor(info.name, info.torch_dtype, info.shape, None, (info.name,)))
            continue
        scale_name = info.name[: -len(".weight")] + scale_suffix(options.strategy)
        scale_shape = fq.scale_shape(options.strategy, info.shape, options.block)
        shard.tensors.append(OutTensor(info.name, fq.FP8_DTYPE, info.shape, None, (info.name,)))
        shard.tensors.append(OutTensor(scale_name, torch.float32, scale_shape, None, (info.name,)))
    return shard


def _check_options(options: Fp8Options) -> None:
    if options.strategy not in fq.STRATEGIES:
        raise ConvertError(f"--strategy {options.strategy} is unknown; use one of {', '.join(fq.STRATEGIES)}")
    if min(options.block) < 1 or options.tp < 1 or options.workers < 1:
        raise ConvertError(
            f"--block-size {options.block}, --tp {options.tp} and --workers {options.workers} must all be >= 1"
        )


def _read_config(src: Path) -> dict:
    config = read_model_config(src)
    heads = config.get("num_key_value_heads")
    if heads is not None and (type(heads) is not int or heads < 1):
        raise ConvertError(
            f"{src / 'config.json'}: num_key_value_heads={heads!r} is not a positive integer; "
            "restore it from the original checkpoint"
        )
    return config


def _refuse_fp8_input(src: Path, source: SafetensorsDir, config: dict) -> None:
    existing = config.get("quantization_config")
    if existing:
        method = existing.get("quant_method") if isinstance(existing, dict) else existing
        raise ConvertError(
            f"{src} is already quantized (quantization_config.quant_method={method!r}); "
            "convert from the bf16 / fp16 / fp32 checkpoint"
        )
    fp8 = [n for n, i in source.tensors.items() if i.dtype.startswith("F8")]
    if fp8:
        raise ConvertError(
            f"{src} already holds FP8 tensors ({fp8[0]} is {source.tensors[fp8[0]].dtype}, "
            f"{len(fp8)} in all); convert from the bf16 / fp16 / fp32 checkpoint"
        )


def _block_that_fits(shapes: dict, options: Fp8Options, config: dict) -> tuple[int, int] | None:
    """The largest square block, halving from the one asked for down to 16, that every tensor allows at this
    --tp (small models: the quickstart's 128-wide one needs 64x64)."""
    size = min(options.block) // 2
    while size >= 16:
        if not check_all(shapes, options.tp, options.strategy, (size, size), config):
            return size, size
        size //= 2
    return None


def _tp_message(problems: list[str], options: Fp8Options, fits: tuple[int, int] | None = None) -> str:
    listed = "\n  ".join(problems[:20]) + (f"\n  … and {len(problems) - 20} more" if len(problems) > 20 else "")
    smaller = f"--block-size {fits[0]} {fits[1]} (fits every tensor here)" if fits else "a smaller --block-size"
    return (
        f"with --tp {options.tp} and --strategy {options.strategy} (block {options.block[0]}x"
        f"{options.block[1]}), vLLM would refuse {len(problems)} tensors:\n  {listed}\n"
        f"Fix: choose a --tp these sizes divide by, {smaller}, --strategy channel, or --skip those layers."
    )
