"""Will vLLM accept these FP8 blocks under tensor parallelism? Checked before writing anything.

vLLM splits column-parallel layers (q/k/v, gate/up, ...) by output rows and row-parallel layers
(o_proj, down_proj) by input columns, and refuses a block-quantized layer whose per-rank part is
not a whole number of blocks. It also fuses q/k/v and gate/up into one GEMM, which requires every
part but the last (q, k, gate) to be a whole number of row blocks even with one rank. K/V heads
are replicated when there are fewer of them than ranks. This module applies the same rules to
names and shapes and lists every tensor that breaks one; for channel and tensor scales only the
split itself must be even.

Left out: MoE expert weights (vLLM checks them on the fused expert tensor).
"""

from __future__ import annotations

ROW_PARALLEL = ("o_proj", "down_proj", "out_proj", "dense_4h_to_h", "fc2", "w2", "c_proj", "linear_proj", "linear_fc2")
MERGED_NOT_LAST = ("q_proj", "k_proj", "gate_proj", "w1")
KV_PROJ = ("k_proj", "v_proj")


def _leaf(name: str) -> str:
    parts = name.split(".")
    return parts[-2] if len(parts) >= 2 else name


def column_rows_per_rank(name: str, rows: int, tp: int, config: dict) -> int | None:
    """Rows of a column-parallel weight on one rank (None when they do not split evenly)."""
    kv_heads = config.get("num_key_value_heads")
    if _leaf(name) in KV_PROJ and kv_heads and kv_heads < tp:
        return rows // kv_heads  # one replicated head per rank
    return rows // tp if rows % tp == 0 else None


def check_tensor(
    name: str, shape: tuple[int, int], tp: int, strategy: str, block: tuple[int, int], config: dict
) -> str | None:
    """A one-line problem description, or None when vLLM will load this tensor."""
    rows, cols = shape
    bn, bk = block
    if _leaf(name) in ROW_PARALLEL:
        if tp > 1 and cols % tp:
            return f"{name}: {cols} input columns do not split over --tp {tp} (row-parallel)"
        if strategy == "block" and tp > 1 and (cols // tp) % bk:
            return f"{name}: {cols // tp} input columns per rank is not a multiple of block_k={bk} (row-parallel)"
        return None
    per_rank = column_rows_per_rank(name, rows, tp, config)
    if per_rank is None:
        return f"{name}: {rows} output rows do not split over --tp {tp} (column-parallel)"
    must_fill_blocks = tp > 1 or _leaf(name) in MERGED_NOT_LAST
    if strategy == "block" and must_fill_blocks and per_rank % bn:
        why = "column-parallel" if tp > 1 else "fused with the next projection"
        return f"{name}: {per_rank} output rows per rank is not a multiple of block_n={bn} ({why})"
    return None


def check_all(
    shapes: dict[str, tuple[int, int]], tp: int, strategy: str, block: tuple[int, int], config: dict
) -> list[str]:
    problems = (check_tensor(name, shape, tp, strategy, block, config) for name, shape in shapes.items())
    return [p for p in problems if p]
