"""The training batch: prompt + completion token ids laid out for one forward pass.

A step's samples (``rlx.store.base.Sample``, the one currency from the collectors to the trainer)
become a batch here and nowhere else (``collate``), on the trainer's side.

Prompts are left-padded and completions right-padded, so completion token ``j`` of every
row sits at column ``P + j`` and one ``logits_to_keep`` slice scores them all. Position ids
restart at 0 at each prompt's first real token, as the rollout engine saw them. Batches cross
ranks as tensors (``broadcast_batch``), never pickled.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlx.store.base import Sample

TENSOR_FIELDS = ("input_ids", "attention_mask", "position_ids", "completion_ids", "mask", "rollout_logp", "rewards")


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # [B, P + T] long
    attention_mask: torch.Tensor  # [B, P + T] long
    position_ids: torch.Tensor  # [B, P + T] long
    completion_ids: torch.Tensor  # [B, T] long
    mask: torch.Tensor  # [B, T] float, 1 on real completion tokens
    rollout_logp: torch.Tensor  # [B, T] float, the rollout engine's logprobs of the sampled tokens
    rewards: torch.Tensor  # [B] float
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    routes: torch.Tensor | None = None  # [B, P + T, layers, top_k] int16, the engine's experts; -1: none recorded

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, index: slice | torch.Tensor) -> TrainBatch:
        return TrainBatch(
            **{
                f.name: (v[index] if isinstance(v, torch.Tensor) else v)
                for f in dataclasses.fields(self)
                for v in [getattr(self, f.name)]
            }
        )

    def to(self, device: torch.device) -> TrainBatch:
        return TrainBatch(
            **{
                f.name: (v.to(device) if isinstance(v, torch.Tensor) else v)
                for f in dataclasses.fields(self)
                for v in [getattr(self, f.name)]
            }
        )


def collate(samples: list[Sample], pad_id: int, prompt_len: int = 0, completion_len: int = 0) -> TrainBatch:
    """The padded batch of ``samples``, one row each: prompts left-padded to ``prompt_len`` and completions
    right-padded to ``completion_len`` (0: the longest sample's), the loss mask from ``Sample.mask``. The one
    place a step's samples become a ``TrainBatch``."""
    prompt_len = prompt_len or max(len(s.prompt_ids) for s in samples)
    completion_len = completion_len or max(1, *(len(s.completion_ids) for s in samples))
    prompts, prompt_lens = _aligned([s.prompt_ids for s in samples], prompt_len, pad_id, torch.long, left=True)
    completions, completion_lens = _aligned([s.completion_ids for s in samples], completion_len, pad_id, torch.long)
    input_ids = torch.cat([prompts, completions], dim=1)
    columns = torch.arange(prompt_len + completion_len)
    attention = (
        (columns >= prompt_len - prompt_lens[:, None]) & (columns < prompt_len + completion_lens[:, None])
    ).long()
    mask = _aligned([s.mask() for s in samples], completion_len, 0.0, torch.float32)[0]
    rollout_logp = _aligned([s.logprobs for s in samples], completion_len, 0.0, torch.float32)[0]
    position_ids = (attention.cumsum(dim=1) - 1).clamp(min=0)
    return TrainBatch(
        input_ids,
        attention,
        position_ids,
        completions,
        mask,
        rollout_logp,
        torch.tensor([s.reward for s in samples], dtype=torch.float32),
        routes=_routes(samples, prompt_len - prompt_lens, prompt_len + completion_len),
    )


def _routes(samples: list[Sample], starts: torch.Tensor, width: int) -> torch.Tensor | None:
    """The samples' MoE routes laid out as their tokens are (row ``i``'s from column ``starts[i]``), -1 where a
    sample recorded none; None when no sample has routes."""
    shaped = next((s.routes for s in samples if s.routes is not None), None)
    if shaped is None:
        return None
    out = torch.full((len(samples), width, *shaped.shape[1:]), -1, dtype=torch.int16)
    for row, (sample, start) in enumerate(zip(samples, starts.tolist(), strict=True)):
        if sample.routes is not None:
            out[row, start : start + len(sample.routes)] = sample.routes.to(torch.int16)
    return out


def build_batch(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    rollout_logps: list[list[float]],
    rewards: list[float],
    pad_id: int,
    token_masks: list[list[float]] | None = None,
) -> TrainBatch:
    """``collate`` of samples given as lists: ``prompt_ids[i]`` is the prompt of sample ``i``; ``token_masks[i]``
    (one value per completion token) marks which completion tokens the loss covers, e.g. 0 on a multi-turn
    episode's observations (``rlx.agent.episode``); without it every completion token counts."""
    masks = token_masks if token_masks is not None else [None] * len(prompt_ids)
    return collate(
        [
            Sample.of(p, c, lp, r, m)
            for p, c, lp, r, m in zip(prompt_ids, completion_ids, rollout_logps, rewards, masks, strict=True)
        ],
        pad_id,
    )


def _aligned(rows: list, width: int, fill, dtype: torch.dtype, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` (1-d tensors) as one ``[len(rows), width]`` tensor, each row's values at its start (or end,
    ``left``) and ``fill`` elsewhere, and the row lengths: one copy of the concatenated values."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    if int(lengths.max()) > width:
        raise ValueError(f"a row of {int(lengths.max())} values does not fit a width of {width}")
    columns = torch.arange(width)[None, :]
    where = columns >= width - lengths[:, None] if left else columns < lengths[:, None]
    out = torch.full((len(rows), width), fill, dtype=dtype)
    out[where] = torch.cat([torch.as_tensor(r).reshape(-1) for r in rows]).to(dtype)  # row-major: each row in order
    return out, lengths


def batch_bytes(batch: TrainBatch) -> int:
    """The bytes ``broadcast_batch`` sends each rank: its shape header and every tensor it carries."""
    return 3 * 8 + sum(getattr(batch, name).numel() * getattr(batch, name).element_size() for name in TENSOR_FIELDS)


def broadcast_batch(batch: TrainBatch | None, device: torch.device, src: int = 0) -> TrainBatch:
    """Send rank ``src``'s batch to every rank: a shape header, then each tensor (on ``device``), then the MoE
    routes where the batch has them."""
    header = torch.zeros(5, dtype=torch.long, device=device)
    if dist.get_rank() == src:
        route_shape = batch.routes.shape[2:] if batch.routes is not None else (0, 0)
        sizes = [batch.size, batch.input_ids.shape[1], batch.completion_ids.shape[1], *route_shape]
        header[:] = torch.tensor(sizes, device=device)
    dist.broadcast(header, src)
    rows, total_len, completion_len, route_layers, route_k = header.tolist()
    shapes = {
        "input_ids": (rows, total_len),
        "attention_mask": (rows, total_len),
        "position_ids": (rows, total_len),
        "completion_ids": (rows, completion_len),
        "mask": (rows, completion_len),
        "rollout_logp": (rows, completion_len),
        "rewards": (rows,),
    }
    dtypes = {"mask": torch.float32, "rollout_logp": torch.float32, "rewards": torch.float32}
    tensors = {}
    for name in TENSOR_FIELDS:
        if dist.get_rank() == src:
            tensor = getattr(batch, name).to(device).contiguous()
        else:
            tensor = torch.empty(shapes[name], dtype=dtypes.get(name, torch.long), device=device)
        dist.broadcast(tensor, src)
        tensors[name] = tensor
    if route_layers:
        shape = (rows, total_len, route_layers, route_k)
        if dist.get_rank() == src:
            routes = batch.routes.to(device)
        else:
            routes = torch.empty(shape, dtype=torch.int16, device=device)
        dist.broadcast(routes, src)
        tensors["routes"] = routes
    return TrainBatch(**tensors)
