"""Build the quickstart's starting point: a tiny model briefly supervised on ``tiny_math``.

RL needs a policy that is sometimes right: a random tiny model never answers "12+7=" with
"19", so every reward is 0 and nothing is learned. This trains the kit's tiny model for a
few hundred steps of next-token prediction on the task's *train* problems (never the
held-out ones), stopping well before it has learned the task, and saves it as a Hugging Face
directory. It is seeded and single-threaded, so the same arguments give the same model.
Run it directly (``python -m rlx.engine.warmstart OUT``) or let ``rlx train`` build it on
first use (``model.build_if_missing: tiny_math_warmstart``).
"""

from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path

import torch

from rlx.engine.tiny import build_tiny_model

DEFAULT_STEPS = 400


def build_tiny_math_warmstart(out_dir: str | Path, task_cfg, steps: int = DEFAULT_STEPS, seed: int = 0,
                              batch_size: int = 64, lr: float = 1e-3, progress=None) -> Path:
    """Write the warm-started model to ``out_dir`` atomically (build in a sibling, then rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx.rollout.tasks import build_task

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    build_tiny_model(tmp, hidden_size=128, num_layers=2, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(tmp)
    model = AutoModelForCausalLM.from_pretrained(tmp)
    task = build_task(task_cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _train(model, tokenizer, [(p.prompt, p.answer) for p in task.train], steps, seed, batch_size, lr, progress)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(str(tmp), safe_serialization=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def _train(model, tokenizer, pairs: list[tuple[str, str]], steps: int, seed: int, batch_size: int, lr: float,
           progress) -> None:
    """Next-token loss on the answer and EOS only: the operands are not predictable, the sum is."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    for step in range(steps):
        rows = []
        for prompt, answer in (rng.choice(pairs) for _ in range(batch_size)):
            prompt_ids, answer_ids = encode(prompt), encode(answer) + [tokenizer.eos_token_id]
            rows.append((prompt_ids + answer_ids, [-100] * len(prompt_ids) + answer_ids))
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.tensor([ids + [tokenizer.pad_token_id] * (width - len(ids)) for ids, _ in rows])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if progress is not None:
            progress(step + 1, steps, loss.item())


def main() -> None:
    from rlx.config.schema import TaskConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    build_tiny_math_warmstart(args.out_dir, TaskConfig(name="tiny_math"), steps=args.steps, seed=args.seed,
                              progress=lambda s, n, loss: print(f"step {s}/{n} loss {loss:.3f}") if s % 50 == 0 else None)


if __name__ == "__main__":
    main()
