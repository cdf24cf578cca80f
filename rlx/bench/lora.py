"""``rlx bench-sync --lora-rank R``: adapter-only against merged LoRA sync of the same model, same sender.

For a model (a preset's or an HF directory's tensors) the bench draws LoRA factors of rank R for every
linear weight whose module is in ``LORA_TARGETS`` (all seven of a Qwen2 layer, as ``configs/quickstart_lora.yaml``
adapts), in float32 (the trainer's dtype, which ``model.lora.sync=adapter`` sends). Then, alternating
round by round through one double-buffered sender of the run's first bucket size:

* ``merged``: what ``model.lora.sync=merged`` does at every sync -- each adapted weight merged on the fly,
  ``(W.float() + (alpha / r) * B @ A).to(dtype)`` (``rlx.trainer.lora.merged_named_tensors``), streamed with the
  untouched ones; the merge runs inside the send, as it does in the trainer;
* ``adapter``: the factors alone (``rlx.trainer.lora.adapter_named_tensors``).

Left out: what the receiver does with them (the hf server's merge, vLLM's LoRA load): the ``process``
target only copies; ``--target server`` would need a server started with ``model.lora``.
"""

from __future__ import annotations

import statistics

import torch

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_ALPHA_PER_RANK = 2.0  # alpha = 2 r, as configs/quickstart_lora.yaml


def lora_factors(tensors: list[tuple[str, torch.Tensor]], rank: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``<module>.lora_A.weight`` [r, in] and ``<module>.lora_B.weight`` [out, r] (float32) per adapted weight."""
    gen = torch.Generator().manual_seed(seed)
    factors = {}
    for name, weight in tensors:
        module = name.removesuffix(".weight")
        if weight.dim() != 2 or not name.endswith(".weight") or module.rsplit(".", 1)[-1] not in LORA_TARGETS:
            continue
        out_features, in_features = weight.shape
        factors[f"{module}.lora_A.weight"] = torch.randn(rank, in_features, generator=gen).to(weight.device) * 0.01
        factors[f"{module}.lora_B.weight"] = torch.randn(out_features, rank, generator=gen).to(weight.device) * 0.01
    if not factors:
        raise ValueError(f"--lora-rank: the model has no linear weight named after {', '.join(LORA_TARGETS)}")
    return factors


def merged_stream(tensors: list[tuple[str, torch.Tensor]], factors: dict[str, torch.Tensor], scale: float):
    """The merged sync's tensors, merged as they are sent (the trainer's ``merged_named_tensors``)."""
    for name, weight in tensors:
        module = name.removesuffix(".weight")
        a = factors.get(f"{module}.lora_A.weight")
        if a is None:
            yield name, weight
            continue
        b = factors[f"{module}.lora_B.weight"]
        yield name, (weight.float() + (b @ a) * scale).to(weight.dtype)


async def bench_lora(opts, model, transport: str, device: str, bucket_mb: int, channels) -> list:
    """Rows ``merged rR`` and ``adapter rR`` (vs_ceiling is filled in by the caller; the footer compares them)."""
    from rlx.bench.sync import BenchRow
    from rlx.config.sync import SyncConfig
    from rlx.sync.factory import make_sender

    rank = opts.lora_rank
    factors = lora_factors(model.tensors, rank)
    scale = LORA_ALPHA_PER_RANK  # alpha / r
    adapter = list(factors.items())
    sizes = {"merged": model.nbytes, "adapter": sum(t.numel() * t.element_size() for t in factors.values())}
    times: dict[str, list[float]] = {"merged": [], "adapter": []}
    sender = make_sender(
        SyncConfig(transport=transport, bucket_mb=bucket_mb, num_buffers=2, timeout_s=opts.timeout_s), device
    )
    try:
        for repeat in range(opts.repeats + 1):  # the first round is the warm-up
            for mode in ("merged", "adapter"):
                tensors = merged_stream(model.tensors, factors, scale) if mode == "merged" else adapter
                report = await sender.send(tensors, channels)
                assert report.total_bytes == sizes[mode], (mode, report.total_bytes, sizes[mode])
                if repeat:
                    times[mode].append(report.seconds)
    finally:
        sender.close()
    rows = []
    for mode in ("merged", "adapter"):
        seconds = statistics.median(times[mode])
        rows.append(
            BenchRow(
                model.label,
                transport,
                f"{mode} r{rank}",
                bucket_mb,
                2,
                sizes[mode],
                seconds,
                sizes[mode] / seconds / 1e9,
                0.0,
                None,
                None,
                times[mode],
            )
        )
    return rows
