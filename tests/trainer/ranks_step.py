"""Run one trainer step on a fixed batch at rank RANK of WORLD_SIZE; rank 0 prints a JSON summary.

Used by test_ranks.py through real processes (gloo). Not a test module itself. With ``--lora OUT CKPT``
(test_lora_ranks.py) the model trains a LoRA adapter for two steps on the batch, checkpointing after the
first into CKPT; then a second trainer resumes from that checkpoint and takes the second step again. Rank 0
writes the merged weights and the adapter of both into the safetensors file OUT. With ``--nan`` a second step
trains on the batch with one reward NaN, in a group that only the last rank trains on; rank 0 prints whether
that step was skipped and left every weight as it was.
"""

import json
import sys

import torch

from rlx.config.roles import trainer_role


def main(model_dir: str, lora: list[str], nan: bool = False) -> None:
    from rlx.config.model import LoraConfig, ModelConfig
    from rlx.config.schema import RunConfig
    from rlx.config.trainer import TrainerConfig
    from rlx.trainer.ranks import init_distributed
    from rlx.trainer.trainer import Trainer

    init_distributed("cpu")
    torch.manual_seed(0)
    adapter = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "gate_proj"], sync="merged")
    cfg = RunConfig(
        model=ModelConfig(path=model_dir, lora=adapter if lora else LoraConfig()),
        trainer=TrainerConfig(micro_batch_size=3, lr=1e-2 if lora else 1e-3),
    )
    cfg.rollout.n = 4
    trainer = Trainer(trainer_role(cfg))
    if lora:
        return lora_steps(trainer, Trainer(trainer_role(cfg)), *lora)
    metrics = trainer.step(fixed_batch())
    params = {name: t.double().sum().item() for name, t in trainer.named_tensors()}
    if nan:
        return nan_step(trainer)
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        print(
            "RESULT"
            + json.dumps(
                {
                    "loss": metrics["loss"],
                    "grad_norm": metrics["grad_norm"],
                    "entropy": metrics["entropy"],
                    "params": params,
                }
            )
        )
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def fixed_batch():
    from rlx.trainer.batch import build_batch

    generator = torch.Generator().manual_seed(123)
    prompts, completions, logps, rewards = [], [], [], []
    for i in range(12):  # 3 prompts x 4 samples, ragged lengths
        prompts.append(torch.randint(4, 40, (2 + i % 3,), generator=generator).tolist())
        completion = torch.randint(4, 40, (1 + (i * 7) % 5,), generator=generator).tolist()
        completions.append(completion)
        logps.append([-1.0 - 0.1 * j for j in range(len(completion))])
        rewards.append(float((i * 5) % 3 == 0))
    return build_batch(prompts, completions, logps, rewards, pad_id=0)


def nan_step(trainer) -> None:
    before = {name: t.clone() for name, t in trainer.named_tensors()}
    batch = fixed_batch()
    batch.rewards[9] = float("nan")  # rows 8..11, the third group: the second rank's share (padded, contiguous)
    metrics = trainer.step(batch)
    unchanged = all(torch.equal(t, before[name]) for name, t in trainer.named_tensors())
    if torch.distributed.get_rank() == 0:
        print("RESULT" + json.dumps({"skipped_nonfinite": metrics["skipped_nonfinite"], "unchanged": unchanged}))
    torch.distributed.destroy_process_group()


def lora_steps(trainer, resumed, out: str, ckpt_root: str) -> None:
    from pathlib import Path

    from safetensors.torch import save_file

    from rlx.trainer.checkpoint import load_checkpoint, save_checkpoint
    from rlx.trainer.lora import adapter_named_tensors

    losses = [trainer.step(fixed_batch())["loss"]]
    save_checkpoint(
        Path(ckpt_root),
        1,
        trainer.model,
        trainer.optimizer,
        trainer.scheduler,
        trainer.cfg.model.path,
        {"step": 1, "data": {}},
        keep=2,
    )
    losses.append(trainer.step(fixed_batch())["loss"])  # B starts at 0: A has a gradient from this step on
    load_checkpoint(Path(ckpt_root) / "step_00000001", resumed.model, resumed.optimizer, resumed.scheduler)
    losses.append(resumed.step(fixed_batch())["loss"])
    tensors = {}
    for prefix, t in (("", trainer), ("resumed.", resumed)):
        tensors.update({f"{prefix}merged.{name}": x for name, x in t.named_tensors()})
        tensors.update({f"{prefix}adapter.{name}": x for name, x in adapter_named_tensors(t.model)})
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        save_file({k: v.contiguous() for k, v in tensors.items()}, out)
        print("RESULT" + json.dumps({"losses": losses}))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[3:] if sys.argv[2:3] == ["--lora"] else [], nan=sys.argv[2:3] == ["--nan"])
