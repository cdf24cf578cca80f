"""Run one trainer step on a fixed batch at rank RANK of WORLD_SIZE; rank 0 prints a JSON summary.

Used by test_ranks.py through real processes (gloo). Not a test module itself.
"""

import json
import sys

import torch


def main(model_dir: str) -> None:
    from rlx.config.schema import ModelConfig, RunConfig, TrainerConfig
    from rlx.engine.batch import build_batch
    from rlx.engine.trainer import Trainer
    from rlx.launch.ranks import init_distributed

    init_distributed("cpu")
    torch.manual_seed(0)
    cfg = RunConfig(model=ModelConfig(path=model_dir), trainer=TrainerConfig(micro_batch_size=3, lr=1e-3))
    cfg.rollout.n = 4
    generator = torch.Generator().manual_seed(123)
    prompts, completions, logps, rewards = [], [], [], []
    for i in range(12):  # 3 prompts x 4 samples, ragged lengths
        prompts.append(torch.randint(4, 40, (2 + i % 3,), generator=generator).tolist())
        completion = torch.randint(4, 40, (1 + (i * 7) % 5,), generator=generator).tolist()
        completions.append(completion)
        logps.append([-1.0 - 0.1 * j for j in range(len(completion))])
        rewards.append(float((i * 5) % 3 == 0))
    batch = build_batch(prompts, completions, logps, rewards, pad_id=0)
    trainer = Trainer(cfg)
    metrics = trainer.step(batch)
    params = {name: t.double().sum().item() for name, t in trainer.named_tensors()}
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        print("RESULT" + json.dumps({"loss": metrics["loss"], "grad_norm": metrics["grad_norm"],
                                     "entropy": metrics["entropy"], "params": params}))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
