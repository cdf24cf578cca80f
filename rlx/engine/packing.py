"""Micro-batches of a step: which rows each rank runs, and in which forward pass.

Two layouts:

- packed (``trainer.micro_batch_tokens > 0``): sequences are assigned to ranks so every rank
  gets about the same number of real tokens (longest first, to the lightest rank), then each
  rank's sequences go to micro-batches the same way, with at most ``micro_batch_tokens``
  tokens each (a longer sequence is never split: it gets a micro-batch of its own). Every rank
  runs the same number of micro-batches -- FSDP2's collectives need it -- and a rank with fewer
  sequences than micro-batches runs fillers (one row, no loss tokens). A micro-batch is one row
  of real tokens back to back, position ids restarting per sequence, and ``cu_seqlens`` for
  the attention (``rlx.engine.attention``); no padding anywhere.
- padded (``micro_batch_tokens = 0``): contiguous shares of rows per rank, ``micro_batch_size``
  rows per micro-batch, prompts left- and completions right-padded (``TrainBatch`` layout).

Every rank holds the whole step batch and computes the same plan, so no plan crosses ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlx.engine.batch import TrainBatch


@dataclass
class Packed:
    input_ids: torch.Tensor     # [1, N] long, the real tokens of every sequence back to back
    position_ids: torch.Tensor  # [1, N] long, restarting at 0 per sequence
    cu_seqlens: torch.Tensor    # [n + 1] int32, cumulative sequence lengths
    max_len: int                # longest sequence
    sources: torch.Tensor       # [M] long, the position whose hidden state scores each completion token

    def to(self, device: torch.device) -> Packed:
        return Packed(self.input_ids.to(device), self.position_ids.to(device), self.cu_seqlens.to(device),
                      self.max_len, self.sources.to(device))

    def model_kwargs(self) -> dict:
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "cu_seq_lens_q": self.cu_seqlens,
                "cu_seq_lens_k": self.cu_seqlens, "max_length_q": self.max_len, "max_length_k": self.max_len}


@dataclass
class MicroBatch:
    rows: torch.Tensor       # [b] long, rows of the step batch (CPU)
    batch: TrainBatch        # those rows; completion tokens scored where batch.mask is 1
    packed: Packed | None    # None in the padded layout
    num_tokens: int          # real (prompt + completion) tokens through the model; 0 for a filler

    def to(self, device: torch.device) -> MicroBatch:
        packed = self.packed.to(device) if self.packed is not None else None
        return MicroBatch(self.rows, self.batch.to(device), packed, self.num_tokens)


def micro_batches(full: TrainBatch, rank: int, world: int, micro_batch_tokens: int,
                  micro_batch_size: int) -> list[MicroBatch]:
    """This rank's micro-batches of ``full`` (CPU), in the layout the config asks for."""
    lengths = full.attention_mask.sum(dim=1).tolist()
    if micro_batch_tokens > 0:
        plan = plan_packed(lengths, world, micro_batch_tokens)[rank]
    else:
        plan = plan_padded(len(lengths), world, micro_batch_size)[rank]
    return [build(full, rows, packed=micro_batch_tokens > 0) for rows in plan]


def plan_packed(lengths: list[int], world: int, budget: int) -> list[list[list[int]]]:
    """Per rank, per micro-batch, the row indices; tokens balanced, the same count on every rank."""
    by_rank = _spread(range(len(lengths)), lengths, budget=None, min_bins=world)
    num_bins = max(1, max(min(len(rows), math.ceil(sum(lengths[i] for i in rows) / budget)) for rows in by_rank))
    while True:
        plans = [_spread(rows, lengths, budget, num_bins) for rows in by_rank]
        most = max(len(p) for p in plans)
        if all(len(p) == most for p in plans):
            return plans
        num_bins = most


def plan_padded(num_rows: int, world: int, rows_per_batch: int) -> list[list[list[int]]]:
    """Contiguous shares of rows, ``rows_per_batch`` per micro-batch; empty lists are fillers."""
    share = math.ceil(num_rows / world)
    count = max(1, math.ceil(share / rows_per_batch))
    plans = []
    for rank in range(world):
        rows = list(range(rank * share, min((rank + 1) * share, num_rows)))
        plans.append([rows[i * rows_per_batch:(i + 1) * rows_per_batch] for i in range(count)])
    return plans


def _spread(rows, lengths: list[int], budget: int | None, min_bins: int) -> list[list[int]]:
    """Longest first, each to the lightest bin; a new bin when it would pass ``budget``."""
    bins: list[list[int]] = [[] for _ in range(min_bins)]
    loads = [0] * min_bins
    for row in sorted(rows, key=lambda i: (-lengths[i], i)):
        target = min(range(len(bins)), key=lambda b: (loads[b], b))
        if budget is not None and bins[target] and loads[target] + lengths[row] > budget:
            bins.append([])
            loads.append(0)
            target = len(bins) - 1
        bins[target].append(row)
        loads[target] += lengths[row]
    return [sorted(b) for b in bins]


def build(full: TrainBatch, rows: list[int], packed: bool) -> MicroBatch:
    """The micro-batch of ``rows``; an empty list gives a filler (row 0, no loss tokens)."""
    index = torch.tensor(rows or [0], dtype=torch.long)
    batch = full.rows(index)
    if not rows:
        batch.mask = torch.zeros_like(batch.mask)
    num_tokens = int(batch.attention_mask.sum()) if rows else 0
    return MicroBatch(index, batch, pack(batch) if packed else None, num_tokens)


def pack(batch: TrainBatch) -> Packed:
    """One row of ``batch``'s real tokens, and where each completion token is scored from."""
    keep = batch.attention_mask.bool()
    prompt_len = batch.input_ids.shape[1] - batch.completion_ids.shape[1]
    scored = batch.mask.bool()
    if (scored.any(dim=1) & ~keep[:, :prompt_len].any(dim=1)).any():
        raise ValueError("a sample has a completion but an empty prompt; every sample needs at least one "
                         "prompt token (the token that scores its first completion token)")
    flat = (keep.flatten().cumsum(0) - 1).view_as(keep)  # position of each real token in the packed row
    lengths = keep.sum(dim=1)
    cu_seqlens = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    return Packed(batch.input_ids[keep].unsqueeze(0), batch.position_ids[keep].unsqueeze(0), cu_seqlens,
                  int(lengths.max()), (flat[:, prompt_len:] - 1)[scored])
