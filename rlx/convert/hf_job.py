"""A conversion whose output is a Hugging Face directory, from a trainer checkpoint or an HF dir.

``HFJob`` holds the output tensors (each with a function that streams its rows), the shard
plan and the template directory of config / tokenizer files; ``plan()`` describes it for
``--dry-run`` and ``run()`` writes it atomically. The torch_dist reader builds an ``HFJob`` too.

Left out: the Megatron direction (``rlx.convert.megatron.to_torch_dist``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console

from rlx.convert.destination import staged_directory
from rlx.convert.hf_write import copy_model_files, target_dtype, write_shards
from rlx.convert.memory import release_freed_buffers
from rlx.convert.plan import Plan, PlanRow
from rlx.convert.progress import byte_progress
from rlx.convert.safetensors_io import SafetensorsDir
from rlx.convert.safetensors_writer import ChunkSource, OutTensor, natural_key, plan_shards, write_index
from rlx.convert.trainer_ckpt import TrainerCheckpoint, check_lm_head
from rlx.formats.experts import expert_parts

ROW_CHUNK_BYTES = 64 << 20


@dataclass
class RunSummary:
    destination: Path
    files: list[str]
    bytes_in: int
    bytes_out: int
    seconds: float
    notes: list[str] = field(default_factory=list)


@dataclass
class HFJob:
    title: str
    source: str
    template: Path
    tensors: list[OutTensor]
    bytes_in: int
    shard_bytes: int
    dtype: torch.dtype | None
    peak_memory_bytes: int
    workers: int = 1
    notes: list[str] = field(default_factory=list)
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    """Entered around the whole run (the torch_dist reader needs a process group)."""

    def __post_init__(self) -> None:
        self.shards = plan_shards(self.tensors, self.shard_bytes)

    def plan(self, destination: Path) -> Plan:
        rows = [
            PlanRow(t.name, t.sources, t.shape, str(t.dtype).removeprefix("torch."), t.nbytes, s.file_name)
            for s in self.shards
            for t in s.tensors
        ]
        return Plan(
            self.title, self.source, str(destination), rows, self.bytes_in, self.peak_memory_bytes, list(self.notes)
        )

    def run(self, destination: Path, console: Console | None = None, show_progress: bool = True) -> RunSummary:
        start = time.perf_counter()
        release_freed_buffers()
        bytes_out = sum(s.nbytes for s in self.shards)
        with staged_directory(destination) as tmp, self.context():
            copy_model_files(self.template, tmp, self.dtype)
            with byte_progress("writing", bytes_out, console, show_progress) as advance:
                write_shards(tmp, self.shards, self.workers, advance)
            write_index(tmp, self.shards)
        files = sorted(p.name for p in destination.iterdir())
        return RunSummary(destination, files, self.bytes_in, bytes_out, time.perf_counter() - start, list(self.notes))


def row_chunks(
    source: SafetensorsDir, name: str, dtype: torch.dtype, chunk_bytes: int = ROW_CHUNK_BYTES
) -> ChunkSource:
    """Stream a tensor in blocks of rows (~chunk_bytes each), cast to ``dtype``."""
    info = source.tensors[name]

    def chunks():
        if len(info.shape) == 0 or info.shape[0] == 0:
            yield source.read(name).to(dtype)
            return
        rows = max(1, chunk_bytes // max(1, info.nbytes // info.shape[0]))
        for row in range(0, info.shape[0], rows):
            yield source.read_rows(name, row, min(row + rows, info.shape[0])).to(dtype)

    return chunks


def passthrough_tensors(source: SafetensorsDir, dtype: torch.dtype | None) -> list[OutTensor]:
    """Every tensor of ``source`` under its own name (cast when ``dtype`` is given); a fused expert tensor
    (transformers' in-memory layout, which a trainer checkpoint holds) as one tensor per expert, the layout
    transformers saves and vLLM loads (``rlx.formats.experts``)."""
    out = []
    for name in sorted(source.tensors, key=natural_key):
        info = source.tensors[name]
        to = target_dtype(info.torch_dtype, dtype)
        parts = expert_parts(name, info.shape)
        out += [_expert_tensor(source, name, to, *part) for part in parts]
        if not parts:
            out.append(OutTensor(name, to, info.shape, row_chunks(source, name, to), (name,)))
    return sorted(out, key=lambda t: natural_key(t.name))


def _expert_tensor(source: SafetensorsDir, name: str, dtype: torch.dtype, out_name: str, expert: int, rows: slice):
    def chunks():
        yield source.read_rows(name, expert, expert + 1)[0, rows].to(dtype)

    shape = tuple(torch.empty(source.tensors[name].shape[1:], device="meta")[rows].shape)
    return OutTensor(out_name, dtype, shape, chunks, (name,))


def _peak(tensors: list[OutTensor], workers: int) -> int:
    return workers * 2 * min(ROW_CHUNK_BYTES * 2, max((t.nbytes for t in tensors), default=0))


def trainer_to_hf_job(ckpt: TrainerCheckpoint, dtype: torch.dtype | None, shard_bytes: int, workers: int) -> HFJob:
    source = SafetensorsDir(ckpt.path, files=ckpt.model_files)
    check_lm_head(ckpt, set(source.tensors))
    tensors = passthrough_tensors(source, dtype)
    notes = [f"skipped: {reason}" for reason in ckpt.skipped]
    return HFJob(
        f"trainer checkpoint (step {ckpt.step}) -> Hugging Face",
        str(ckpt.path),
        ckpt.hf_dir,
        tensors,
        source.total_bytes,
        shard_bytes,
        dtype,
        _peak(tensors, workers),
        workers,
        notes,
    )


def hf_to_hf_job(src: Path, dtype: torch.dtype | None, shard_bytes: int, workers: int) -> HFJob:
    source = SafetensorsDir(src)
    tensors = passthrough_tensors(source, dtype)
    return HFJob(
        "Hugging Face -> Hugging Face (re-shard / cast)",
        str(src),
        src,
        tensors,
        source.total_bytes,
        shard_bytes,
        dtype,
        _peak(tensors, workers),
        workers,
    )
