"""The activations each backend keeps for the backward, per micro-batch of one step's batch, on a CPU.

A tiny Qwen2 and a step batch shaped as a GRPO step is (``--groups`` prompts of 60-120 tokens, ``--n`` samples
each of 20-200 tokens), planned as each backend's Trainer plans it (``trainer.micro_batch_tokens``): FSDP2's
packed micro-batches carry a group's prompt once (``trainer.share_prompts``); the Megatron backend runs padded
rows, each with its prompt. Every tensor saved for the backward of one micro-batch's forward (the logprobs with
gradients, as the update runs them; ``torch.autograd.graph.saved_tensors_hooks``, each storage once, the
parameters left out) is summed: the largest micro-batch bounds the update's activation peak, the sum its work.
A device-independent reading of the trainer's memory (the GPU's allocator adds its own rounding and caching).

    python benchmarks/megatron_memory.py [--budget 4096] [--json OUT]

``--old-plan`` plans the Megatron backend's micro-batches as rlx did before 7761667 (a group's prompt counted once,
as FSDP2's); with the rlx of that time (``git worktree add DIR 7d59909`` and this file copied there) it measures
the backend as it ran on the GPU then.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BACKENDS = ("fsdp2", "megatron")


def step_batch(groups: int, n: int, seed: int):
    from tests.trainer.test_trainer_step import build_batch

    gen = torch.Generator().manual_seed(seed)
    prompts, completions, logps, rewards = [], [], [], []
    for g in range(groups):
        prompt = torch.randint(4, 40, (int(torch.randint(60, 120, (1,), generator=gen)),), generator=gen).tolist()
        for i in range(n):
            length = int(torch.randint(20, 200, (1,), generator=gen))
            completion = torch.randint(4, 40, (length,), generator=gen).tolist()
            prompts.append(prompt)
            completions.append(completion)
            logps.append([-1.0] * length)
            rewards.append(float((g + i) % 2))
    return build_batch(prompts, completions, logps, rewards, pad_id=0)


def saved_bytes(run, params: set[int]) -> int:
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        seen.setdefault(storage.data_ptr(), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(size for ptr, size in seen.items() if ptr not in params)


def measure(model_dir: Path, backend: str, full, budget: int, n: int, old_plan: bool = False) -> dict:
    from rlx.trainer.packing import micro_batches
    from tests.trainer.test_megatron import make_trainer

    trainer = make_trainer(model_dir, backend, micro_batch_tokens=budget)
    share = trainer.cfg.trainer.share_prompts and (old_plan or backend == "fsdp2")  # as Trainer.step plans
    plan = micro_batches(full, 0, 1, budget, trainer.cfg.trainer.micro_batch_size, n, share, None)
    params = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    per = [saved_bytes(lambda mb=mb: trainer._logprobs(trainer.model, mb), params) for mb in plan]
    return {"micro_batches": len(per), "largest_mib": round(max(per) / 2**20, 2), "sum_mib": round(sum(per) / 2**20, 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=4096, help="trainer.micro_batch_tokens of both backends")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--old-plan", action="store_true", help="megatron planned with shared prompts (before 7761667)")
    args = parser.parse_args(argv)
    import subprocess

    from rlx.trainer.tiny import build_tiny_model

    full = step_batch(args.groups, args.n, args.seed)
    with tempfile.TemporaryDirectory(prefix="megatron_memory_") as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model")
        rows = {backend: measure(model_dir, backend, full, args.budget, args.n, args.old_plan) for backend in BACKENDS}
    ratio = rows["megatron"]["largest_mib"] / rows["fsdp2"]["largest_mib"]
    print(f"{args.groups} prompts x {args.n} samples, step batch {tuple(full.input_ids.shape)}, budget {args.budget}")
    print("| backend | micro-batches | largest micro-batch | all micro-batches |\n|---|---|---|---|")
    for backend, row in rows.items():
        print(f"| {backend} | {row['micro_batches']} | {row['largest_mib']} MiB | {row['sum_mib']} MiB |")
    print(f"megatron / fsdp2, largest micro-batch: {ratio:.2f}x")
    if args.json:
        git = ["git", "rev-parse", "--short", "HEAD"]
        commit = subprocess.run(git, capture_output=True, text=True, cwd=ROOT, check=False)
        result = {
            "command": " ".join(["python", "benchmarks/megatron_memory.py", *(argv or sys.argv[1:])]),
            "commit": commit.stdout.strip(),
            "how": "bytes of the tensors saved for the backward of each micro-batch's logprob forward (with "
            "gradients), each storage once, the parameters left out; largest and sum over the step's micro-batches",
            "budget": args.budget,
            "step_batch": list(full.input_ids.shape),
            **rows,
            "largest_ratio": round(ratio, 3),
        }
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
