"""Micro-batches of a step: which rows each rank runs, and in which forward pass.

Two layouts:

- packed (``trainer.micro_batch_tokens > 0``): sequences are assigned to ranks so every rank
  gets about the same number of real tokens (longest first, to the lightest rank), then each
  rank's sequences go to micro-batches the same way, with at most ``micro_batch_tokens``
  tokens each (a longer sequence is never split: it gets a micro-batch of its own). Every rank
  runs the same number of micro-batches -- FSDP2's collectives need it -- and a rank with fewer
  sequences than micro-batches runs fillers (one row, no loss tokens). A micro-batch is one row
  of real tokens back to back, position ids restarting per sequence, and ``cu_seqlens`` for
  the attention (``rlx.trainer.attention``); no padding anywhere. Where sequences are a few tokens
  long, the micro-batch also carries ``Blocks``: the row regrouped for one batched attention call.

  With ``trainer.share_prompts`` (the default) the unit of that plan is a group's run of samples
  (``rollout.n`` consecutive rows, split where it passes the budget) rather than one sample, and
  samples in a micro-batch whose prompt tokens are identical carry the prompt once: it goes
  through the model once and each completion attends to it. Logprobs, losses and gradients are
  those of the repeated layout (the prompt's hidden states are the same in every copy, and its
  gradient is the sum over the completions that read it); only the work shrinks, by the prompt's
  length times ``n - 1`` per group.
- padded (``micro_batch_tokens = 0``): contiguous shares of rows per rank, ``micro_batch_size``
  rows per micro-batch, prompts left- and completions right-padded (``TrainBatch`` layout).

Every rank holds the whole step batch and computes the same plan, so no plan crosses ranks.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlx.trainer.attention import BLOCK_PAIR_COST, BLOCKS, KV_INDEX
from rlx.trainer.batch import TrainBatch


@dataclass
class Packed:
    input_ids: torch.Tensor  # [1, N] long, the real tokens of every sequence back to back
    position_ids: torch.Tensor  # [1, N] long, restarting at 0 per sequence
    cu_seqlens: torch.Tensor  # [n + 1] int32, cumulative sequence lengths
    max_len: int  # longest sequence
    sources: torch.Tensor  # [M] long, the position whose hidden state scores each completion token
    kv_index: torch.Tensor | None = None  # shared prompts: [K] long, each sequence's key positions in turn
    cu_seqlens_k: torch.Tensor | None = None  # shared prompts: [n + 1] int32, cumulative key counts
    max_len_k: int = 0
    blocks: Blocks | None = None  # short sequences: the block layout of the attention (``Blocks``)
    routes: torch.Tensor | None = None  # [N, layers, top_k] int16: the engine's experts of each token (MoE)

    def to(self, device: torch.device) -> Packed:
        return _moved(self, device)

    def model_kwargs(self) -> dict:
        kwargs = {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "cu_seq_lens_q": self.cu_seqlens,
            "cu_seq_lens_k": self.cu_seqlens,
            "max_length_q": self.max_len,
            "max_length_k": self.max_len,
        }
        if self.kv_index is not None:
            kwargs.update({KV_INDEX: self.kv_index, "cu_seq_lens_k": self.cu_seqlens_k, "max_length_k": self.max_len_k})
        if self.blocks is not None:
            kwargs[BLOCKS] = self.blocks
        return kwargs


@dataclass
class Blocks:
    """The packed row as blocks for one batched attention call where sequences are short: a block is the
    tokens of the samples that share one prompt (the prompt once, then each completion), or one sequence.
    ``index`` [G, L] gives each block's row positions in order (0 past its end), ``mask`` [G, 1, L, L] what each
    query sees: earlier tokens of its own sample and of the prompt it shares; ``inverse`` [N] takes the blocks'
    real positions back to row order (None where they are already in it)."""

    index: torch.Tensor
    valid: torch.Tensor
    mask: torch.Tensor
    inverse: torch.Tensor | None

    def to(self, device: torch.device) -> Blocks:
        return _moved(self, device)


def _moved(layout, device: torch.device):
    """A copy of the dataclass ``layout`` with its tensors (and nested ``Blocks``) on ``device``."""
    return dataclasses.replace(
        layout,
        **{
            f.name: value.to(device)
            for f in dataclasses.fields(layout)
            if isinstance(value := getattr(layout, f.name), (torch.Tensor, Blocks))
        },
    )


@dataclass
class MicroBatch:
    rows: torch.Tensor  # [b] long, rows of the step batch (CPU)
    batch: TrainBatch  # those rows; completion tokens scored where batch.mask is 1
    packed: Packed | None  # None in the padded layout
    num_tokens: int  # real (prompt + completion) tokens through the model; 0 for a filler

    def to(self, device: torch.device) -> MicroBatch:
        packed = self.packed.to(device) if self.packed is not None else None
        return MicroBatch(self.rows, self.batch.to(device), packed, self.num_tokens)


def micro_batches(
    full: TrainBatch,
    rank: int,
    world: int,
    micro_batch_tokens: int,
    micro_batch_size: int,
    group_size: int = 1,
    share_prompts: bool = False,
    rows: list[int] | None = None,
) -> list[MicroBatch]:
    """This rank's micro-batches of ``full`` (CPU), in the layout the config asks for. ``group_size``
    consecutive rows are one prompt's samples (``rollout.n``); with ``share_prompts`` (packed layout only)
    they are planned together and carry a prompt they share once. ``rows`` (ascending) are the rows to plan;
    None plans them all."""
    rows = list(range(full.size)) if rows is None else rows
    if micro_batch_tokens <= 0:
        plan = plan_padded(len(rows), world, micro_batch_size)[rank]
        return [build(full, [rows[i] for i in mb], packed=False) for mb in plan]
    units, costs = plan_units(full, group_size if share_prompts else 1, micro_batch_tokens, rows)
    plan = [
        sorted(row for unit in mb for row in units[unit]) for mb in plan_packed(costs, world, micro_batch_tokens)[rank]
    ]
    return [build(full, mb, packed=True, share_prompts=share_prompts) for mb in plan]


def plan_units(
    full: TrainBatch, group_size: int, budget: int, rows: list[int] | None = None
) -> tuple[list[list[int]], list[int]]:
    """The rows planned together and the tokens each such unit puts through the model: one row each, or a
    group's consecutive rows (split where they would pass ``budget``) counting a prompt of one length once.
    Only lengths are read, so ranks that hold the counts but not the tokens (``rlx.trainer.plane``) plan alike;
    rows whose equal-length prompts differ still run, each with its own prompt (a little over the count).
    ``rows`` (ascending) limits the plan to those rows; a group is those of its rows that are there."""
    mask = full.attention_mask
    prompt_len = mask.shape[1] - full.completion_ids.shape[1]
    prompts, completions = mask[:, :prompt_len].sum(dim=1).tolist(), mask[:, prompt_len:].sum(dim=1).tolist()
    units: list[list[int]] = []
    costs: list[int] = []
    for _, members in itertools.groupby(range(full.size) if rows is None else rows, key=lambda r: r // group_size):
        group = list(members)
        if len({prompts[r] for r in group}) > 1:  # different prompts: nothing to share
            units.extend([r] for r in group)
            costs.extend(prompts[r] + completions[r] for r in group)
            continue
        units.append([])
        costs.append(prompts[group[0]])
        for r in group:
            if units[-1] and costs[-1] + completions[r] > budget:
                units.append([])
                costs.append(prompts[group[0]])
            units[-1].append(r)
            costs[-1] += completions[r]
    return units, costs


def plan_packed(lengths: list[int], world: int, budget: int) -> list[list[list[int]]]:
    """Per rank, per micro-batch, the row indices; tokens balanced, the same count on every rank."""
    by_rank = _spread(range(len(lengths)), lengths, budget=None, min_bins=world)
    num_bins = max(1, *(min(len(rows), math.ceil(sum(lengths[i] for i in rows) / budget)) for rows in by_rank))
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
        plans.append([rows[i * rows_per_batch : (i + 1) * rows_per_batch] for i in range(count)])
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


def build(full: TrainBatch, rows: list[int], packed: bool, share_prompts: bool = False) -> MicroBatch:
    """The micro-batch of ``rows``; an empty list gives a filler (row 0, no loss tokens)."""
    index = torch.tensor(rows or [0], dtype=torch.long)
    batch = full.rows(index)
    if not rows:
        batch.mask = torch.zeros_like(batch.mask)
    if not packed:
        return MicroBatch(index, batch, None, int(batch.attention_mask.sum()) if rows else 0)
    layout = pack(batch, share_prompts)
    return MicroBatch(index, batch, layout, layout.input_ids.shape[1] if rows else 0)


def pack(batch: TrainBatch, share_prompts: bool = False, blocks: bool | None = None) -> Packed:
    """One row of ``batch``'s real tokens, and where each completion token is scored from. With
    ``share_prompts``, a row whose prompt tokens equal an earlier row's adds only its completion. ``blocks``:
    the attention's block layout always (True), never (False), or where it costs less (None)."""
    keep = batch.attention_mask.bool()
    prompt_len = batch.input_ids.shape[1] - batch.completion_ids.shape[1]
    scored = batch.mask.bool()
    if (scored.any(dim=1) & ~keep[:, :prompt_len].any(dim=1)).any():
        raise ValueError(
            "a sample has a completion but an empty prompt; every sample needs at least one "
            "prompt token (the token that scores its first completion token)"
        )
    owners = _prompt_owners(batch, keep, prompt_len) if share_prompts else None
    shared = owners is not None
    own = keep.clone()  # the tokens each row adds to the packed row
    if shared:
        own[:, :prompt_len] &= (owners == torch.arange(batch.size))[:, None]
    flat = (own.flatten().cumsum(0) - 1).view_as(own)
    where = torch.where(own, flat, flat[owners]) if shared else flat  # each real token's position in the row
    query_len, key_len = own.sum(dim=1), keep.sum(dim=1)

    def cumulative(lengths):
        return F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)

    packed = Packed(
        batch.input_ids[own].unsqueeze(0),
        batch.position_ids[own].unsqueeze(0),
        cumulative(query_len),
        int(query_len.max()),
        where[:, prompt_len - 1 : -1][scored],
        routes=batch.routes[own] if batch.routes is not None else None,
    )
    if shared:  # keys row by row: its prompt's positions, then its own tokens'
        packed.kv_index, packed.cu_seqlens_k, packed.max_len_k = where[keep], cumulative(key_len), int(key_len.max())
    adder = torch.arange(batch.size)[:, None].expand_as(own)[own]  # the row that put each token in the packed row
    block_of = owners[adder] if shared else adder
    is_prompt = (torch.arange(own.shape[1]) < prompt_len).expand_as(own)[own]
    packed.blocks = blocks_layout(
        block_of, adder, is_prompt, int(query_len.numel()), int(query_len.max()), int(key_len.max()), blocks
    )
    return packed


def blocks_layout(
    block_of: torch.Tensor,
    sequence: torch.Tensor,
    is_prompt: torch.Tensor,
    num_sequences: int,
    max_q: int,
    max_k: int,
    force: bool | None = None,
) -> Blocks | None:
    """The ``Blocks`` of a packed row whose token ``i`` belongs to block ``block_of[i]`` and sequence
    ``sequence[i]`` and is a prompt token where ``is_prompt[i]``; None where one padded row per sequence
    costs less (``force`` overrides: True always, False never). The cost of an attention call counts each
    (row, head) pair as ``BLOCK_PAIR_COST`` scores on top of its scores: a CPU kernel's fixed share per pair
    dominates when rows are a few tokens long."""
    numbers, block = torch.unique(block_of, return_inverse=True)
    sizes = torch.bincount(block, minlength=numbers.numel())
    longest = int(sizes.max())
    if force is None:
        force = numbers.numel() * (longest**2 + BLOCK_PAIR_COST) < num_sequences * (max_q * max_k + BLOCK_PAIR_COST)
    if not force:
        return None
    order = torch.argsort(block, stable=True)  # block by block, each in row order
    slot = torch.arange(block.numel()) - (sizes.cumsum(0) - sizes).repeat_interleave(sizes)
    index = torch.zeros(numbers.numel(), longest, dtype=torch.long)
    valid = torch.zeros(numbers.numel(), longest, dtype=torch.bool)
    index[block[order], slot] = order
    valid[block[order], slot] = True
    seq, prompt = sequence[index], is_prompt[index] & valid
    earlier = torch.ones(longest, longest, dtype=torch.bool).tril()
    # a query sees earlier tokens of its own sequence and the prompt it shares; the block's first token is a
    # prompt token, so no query row (padding's included) is left without a key
    mask = earlier & ((seq[:, :, None] == seq[:, None, :]) & valid[:, None, :] | prompt[:, None, :])
    inverse = None if torch.equal(order, torch.arange(order.numel())) else torch.argsort(order)
    return Blocks(index, valid, mask.unsqueeze(1), inverse)


def _prompt_owners(batch: TrainBatch, keep: torch.Tensor, prompt_len: int) -> torch.Tensor | None:
    """For each row, the first row with the same prompt tokens (itself if none, or if it has no completion
    tokens: it would add nothing to attend from); None if no prompt repeats."""
    prompts = batch.input_ids[:, :prompt_len].masked_fill(~keep[:, :prompt_len], -1).numpy()
    completes = keep[:, prompt_len:].any(dim=1).tolist()
    first: dict[bytes, int] = {}
    owners = [first.setdefault(prompts[i].tobytes(), i) if completes[i] else i for i in range(batch.size)]
    if owners == list(range(batch.size)):
        return None
    return torch.tensor(owners, dtype=torch.long)
