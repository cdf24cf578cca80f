"""The FP8 conversion: plan, stream, report.

Each input shard becomes one output shard of the same name, written by a pool of threads (one
shard per thread). Inside a shard every tensor is streamed in blocks of rows: read with pread,
quantized, dequantized again to measure the error, and written; a scale tensor follows its
weight in the same shard and is assembled from the per-block scales collected on the way.
Memory is therefore about ``workers x`` a few times ``CHUNK_BYTES``, never the model. The
per-tensor scale needs the tensor's maximum first, so per-tensor quantization reads weights twice.

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
from rlx.convert.fp8.policy import keep_reason, module_name
from rlx.convert.fp8.qconfig import quantization_config, scale_suffix
from rlx.convert.fp8.report import Fp8Report, TensorStats
from rlx.convert.fp8.tp_check import check_all
from rlx.convert.hf_job import row_chunks
from rlx.convert.hf_write import copy_model_files, write_shards
from rlx.convert.memory import release_freed_buffers
from rlx.convert.plan import Plan, PlanRow
from rlx.convert.progress import byte_progress
from rlx.convert.safetensors_io import INDEX_NAME, SafetensorsDir, TensorInfo
from rlx.convert.safetensors_writer import OutTensor, Shard, write_index

CHUNK_BYTES = 32 << 20


@dataclass
class Fp8Options:
    strategy: str = "block"
    block: tuple[int, int] = (128, 128)
    skip: list[str] = field(default_factory=list)
    tp: int = 1
    workers: int = 2


class QuantizedWeight:
    """One source weight streamed into its FP8 tensor, then its scale tensor."""

    def __init__(self, source: SafetensorsDir, info: TensorInfo, options: Fp8Options):
        self.source, self.info, self.options = source, info, options
        self.stats = TensorStats(info.name)
        self._scales: list[torch.Tensor] = []

    def _row_step(self) -> int:
        rows = max(1, CHUNK_BYTES // (4 * max(1, self.info.shape[1])))
        if self.options.strategy == "block":
            rows = max(1, rows // self.options.block[0]) * self.options.block[0]
        return rows

    def _blocks(self):
        rows, step = self.info.shape[0], self._row_step()
        for start in range(0, rows, step):
            yield self.source.read_rows(self.info.name, start, min(start + step, rows)).to(torch.float32)

    def weight_chunks(self):
        strategy, block = self.options.strategy, self.options.block
        amax = max((float(w.abs().max()) for w in self._blocks()), default=0.0) if strategy == "tensor" else None
        self._scales = []
        for w in self._blocks():
            result = fq.quantize(w, strategy, block, amax)
            self.stats.add(result, w.numel())
            self._scales.append(result.scale)
            yield result.q

    def scale_chunks(self):
        if not self._scales:
            raise RuntimeError(f"scale of {self.info.name} requested before its weight was written")
        yield self._scales[0] if self.options.strategy == "tensor" else torch.cat(self._scales)


@dataclass
class Fp8Job:
    src: Path
    source: SafetensorsDir
    options: Fp8Options
    shards: list[Shard]
    weights: list[QuantizedWeight]
    kept: list[tuple[str, str]]
    config: dict

    @property
    def ignored_modules(self) -> list[str]:
        """Modules whose weight stays in high precision (matrices only; norms are not linear layers)."""
        kept = [n for n, _ in self.kept if n.endswith(".weight") and len(self.source.tensors[n].shape) >= 2]
        return sorted({"lm_head", *(module_name(n) for n in kept)})

    def plan(self, destination: Path) -> Plan:
        rows = [PlanRow(t.name, t.sources, t.shape, str(t.dtype).removeprefix("torch."), t.nbytes, s.file_name)
                for s in self.shards for t in s.tensors]
        notes = [f"kept in {self.source.tensors[n].dtype}: {n} ({why})" for n, why in self.kept if why != "not a 2-D weight"]
        notes.append(f"{sum(1 for _, why in self.kept if why == 'not a 2-D weight')} norms / biases / 1-D tensors kept")
        peak = max(1, self.options.workers) * 6 * CHUNK_BYTES
        return Plan(f"FP8 ({self.options.strategy}) conversion", str(self.src), str(destination), rows,
                    self.source.total_bytes, peak, notes)

    def run(self, destination: Path, console: Console | None = None, show_progress: bool = True) -> Fp8Report:
        start = time.perf_counter()
        release_freed_buffers()
        bytes_out = sum(s.nbytes for s in self.shards)
        with staged_directory(destination) as tmp:
            copy_model_files(self.src, tmp, None)
            self._write_config(tmp / "config.json")
            with byte_progress("quantizing", bytes_out, console, show_progress) as advance:
                write_shards(tmp, self.shards, self.options.workers, advance, {"format": "pt"})
            if (self.src / INDEX_NAME).is_file() or len(self.shards) > 1:
                write_index(tmp, self.shards, force=True)
        file_bytes = sum(p.stat().st_size for p in destination.glob("*.safetensors"))
        in_bytes = sum(p.stat().st_size for p in self.source.files)
        return Fp8Report(str(destination), self.options.strategy, self.options.block,
                         [w.stats for w in self.weights], self.kept, in_bytes, file_bytes,
                         time.perf_counter() - start)

    def _write_config(self, path: Path) -> None:
        config = dict(self.config)
        config["quantization_config"] = quantization_config(self.options.strategy, self.options.block,
                                                            self.ignored_modules)
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
    problems = check_all({i.name: i.shape for i in quantized}, options.tp, options.strategy, options.block, config)
    if problems:
        raise ConvertError(_tp_message(problems, options))
    weights = {info.name: QuantizedWeight(source, info, options) for info in quantized}
    shards = [_shard(source, f, weights, options) for f in source.files]
    return Fp8Job(src, source, options, shards, list(weights.values()), kept, config)


def _shard(source: SafetensorsDir, file: Path, weights: dict[str, QuantizedWeight], options: Fp8Options) -> Shard:
    shard = Shard(file.name)
    for info in sorted((i for i in source.tensors.values() if i.file == file), key=lambda i: i.start):
        weight = weights.get(info.name)
        if weight is None:
            shard.tensors.append(OutTensor(info.name, info.torch_dtype, info.shape,
                                           row_chunks(source, info.name, info.torch_dtype), (info.name,)))
            continue
        scale_name = info.name[: -len(".weight")] + scale_suffix(options.strategy)
        scale_shape = fq.scale_shape(options.strategy, info.shape, options.block)
        shard.tensors.append(OutTensor(info.name, fq.FP8_DTYPE, info.shape, weight.weight_chunks, (info.name,)))
        shard.tensors.append(OutTensor(scale_name, torch.float32, scale_shape, weight.scale_chunks, (info.name,)))
    return shard


def _check_options(options: Fp8Options) -> None:
    if options.strategy not in fq.STRATEGIES:
        raise ConvertError(f"--strategy {options.strategy} is unknown; use one of {', '.join(fq.STRATEGIES)}")
    if min(options.block) < 1 or options.tp < 1 or options.workers < 1:
        raise ConvertError(f"--block-size {options.block}, --tp {options.tp} and --workers {options.workers} "
                           "must all be >= 1")


def _read_config(src: Path) -> dict:
    path = src / "config.json"
    if not path.is_file():
        raise ConvertError(f"{src} has no config.json; pass a Hugging Face model directory")
    return json.loads(path.read_text())


def _refuse_fp8_input(src: Path, source: SafetensorsDir, config: dict) -> None:
    existing = config.get("quantization_config")
    if existing:
        raise ConvertError(f"{src} is already quantized (quantization_config.quant_method="
                           f"{existing.get('quant_method')!r}); convert from the bf16 / fp16 / fp32 checkpoint")
    fp8 = [n for n, i in source.tensors.items() if i.dtype.startswith("F8")]
    if fp8:
        raise ConvertError(f"{src} already holds FP8 tensors ({fp8[0]} is {source.tensors[fp8[0]].dtype}, "
                           f"{len(fp8)} in all); convert from the bf16 / fp16 / fp32 checkpoint")


def _tp_message(problems: list[str], options: Fp8Options) -> str:
    listed = "\n  ".join(problems[:20]) + (f"\n  … and {len(problems) - 20} more" if len(problems) > 20 else "")
    return (f"with --tp {options.tp} and --strategy {options.strategy} (block {options.block[0]}x"
            f"{options.block[1]}), vLLM would refuse {len(problems)} tensors:\n  {listed}\n"
            "Fix: choose a --tp these sizes divide by, a smaller --block-size, or --skip those layers.")
