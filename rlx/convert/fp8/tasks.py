"""The units of work of an FP8 conversion: rows of one tensor, read, converted and written in place.

A task reads a block of rows of one source tensor with ``pread``, quantizes it (or copies it, for
a tensor kept in its dtype) and writes the result with ``pwrite`` where the output header put it,
its part of the scale tensor included; tasks therefore need no order and any thread runs any
task. A quantizing task covers whole row blocks of the strategy (``block[0]`` rows for
``block``) and about ``TASK_BYTES`` of float32: small enough that its passes run in the CPU's
cache, and that its buffers stay below glibc's mmap threshold (``rlx.convert.memory``), so the
allocator reuses them instead of mapping fresh pages for every task.

The ``tensor`` strategy needs the whole tensor's max |w| before its first row, so it is one task
per tensor that reads the tensor twice (the second time from the page cache).

Left out: scheduling (``parallel``) and what is quantized (``policy``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rlx.convert.fp8 import quantize as fq
from rlx.convert.fp8.report import TensorStats
from rlx.convert.safetensors_io import SafetensorsDir, TensorInfo
from rlx.convert.safetensors_writer import ShardFile

TASK_BYTES = 3 << 20
Task = Callable[[], int]
"""Runs one unit of work; returns the bytes it wrote."""


def row_step(info: TensorInfo, itemsize: int, multiple: int = 1) -> int:
    """Rows per task: about TASK_BYTES at ``itemsize`` bytes per element, a multiple of ``multiple``."""
    rows = max(1, TASK_BYTES // (itemsize * max(1, math.prod(info.shape[1:]))))
    return max(1, rows // multiple) * multiple


def copy_tasks(source: SafetensorsDir, info: TensorInfo, out: ShardFile) -> list[Task]:
    """A kept tensor: its bytes, unchanged, in blocks of rows."""
    if not info.shape or not info.shape[0]:
        return [lambda: out.write(info.name, 0, source.read(info.name))]
    step, row_bytes = row_step(info, info.torch_dtype.itemsize), info.nbytes // info.shape[0]

    def task(start: int) -> Task:
        end = min(start + step, info.shape[0])
        return lambda: out.write(info.name, start * row_bytes, source.read_rows(info.name, start, end))

    return [task(start) for start in range(0, info.shape[0], step)]


def weight_tasks(
    source: SafetensorsDir,
    info: TensorInfo,
    out: ShardFile,
    scale_name: str,
    strategy: str,
    block: tuple[int, int],
    stats: TensorStats,
) -> list[Task]:
    """A quantized weight: FP8 rows and the matching rows of its scale, per task."""
    rows, cols = info.shape
    if strategy == "tensor":
        return [lambda: _quantize_tensor(source, info, out, scale_name, block, stats)]
    step = row_step(info, 4, block[0] if strategy == "block" else 1)
    scale_cols = fq.scale_shape(strategy, (rows, cols), block)[1]

    def task(start: int) -> Task:
        end = min(start + step, rows)
        scale_row = start // block[0] if strategy == "block" else start

        def run() -> int:
            result = fq.quantize(source.read_rows(info.name, start, end), strategy, block)
            stats.add(result, (end - start) * cols)
            return out.write(info.name, start * cols, result.q) + out.write(
                scale_name, scale_row * scale_cols * 4, result.scale
            )

        return run

    return [task(start) for start in range(0, rows, step)]


def _quantize_tensor(
    source: SafetensorsDir,
    info: TensorInfo,
    out: ShardFile,
    scale_name: str,
    block: tuple[int, int],
    stats: TensorStats,
) -> int:
    rows, cols = info.shape
    step = row_step(info, 4)
    starts = range(0, rows, step)
    amax = max(float(source.read_rows(info.name, s, min(s + step, rows)).abs().max()) for s in starts)
    written = 0
    for start in starts:
        end = min(start + step, rows)
        result = fq.quantize(source.read_rows(info.name, start, end), "tensor", block, amax)
        stats.add(result, (end - start) * cols)
        written += out.write(info.name, start * cols, result.q)
    return written + out.write(scale_name, 0, result.scale)
