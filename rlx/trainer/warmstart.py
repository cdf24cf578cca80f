"""Build a run's starting point: a tiny model briefly supervised on its task (``tiny_math``, ``running_sum``).

RL needs a policy that is sometimes right: a random tiny model never answers "12+7=" with
"19", so every reward is 0 and nothing is learned. This trains the kit's tiny model for a
few hundred steps of next-token prediction on the task's *train* problems (never the
held-out ones), stopping well before it has learned the task, and saves it as a Hugging Face
directory. It is seeded and single-threaded, so the same arguments give the same model.
Run it directly (``python -m rlx.trainer.warmstart OUT --config configs/quickstart.yaml`` builds the model
that config's first run builds; without ``--config``, on tiny_math's default task) or let ``rlx train`` build
it on first use (``model.build_if_missing: tiny_math_warmstart``).
"""

from __future__ import annotations

import argparse
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlx.trainer.tiny import build_tiny_family, build_tiny_model

if TYPE_CHECKING:
    from rlx.config.task import TaskConfig

DEFAULT_STEPS = 400
RUNNING_SUM_STEPS = 600
CALC_TOOLS_STEPS = 105


@dataclass(frozen=True)
class Recipe:
    hidden_size: int
    num_layers: int
    steps: int
    lr: float
    batch_size: int = 64
    seed: int | None = None
    """A fixed seed for this recipe (a teacher built apart from the student); None = the run's trainer.seed."""
    family: str = "qwen2"
    """qwen2 (``build_tiny_model``) or a family of ``rlx.trainer.tiny.MOE_FAMILIES``."""


# model.build_if_missing -> model shape and supervised steps; stopped where held-out accuracy is
# well below 1 so RL has something to learn.
RECIPES = {
    "tiny_math_warmstart": Recipe(hidden_size=128, num_layers=2, steps=DEFAULT_STEPS, lr=1e-3),
    "running_sum_warmstart": Recipe(hidden_size=256, num_layers=2, steps=RUNNING_SUM_STEPS, lr=1e-3, batch_size=32),
    "calc_tools_warmstart": Recipe(hidden_size=128, num_layers=2, steps=CALC_TOOLS_STEPS, lr=1e-3, batch_size=32),
    # the distillation quickstart's teacher: the student's recipe 4x longer (0.922 held out against 0.258)
    "tiny_math_teacher": Recipe(hidden_size=128, num_layers=2, steps=4 * DEFAULT_STEPS, lr=1e-3, seed=1),
    # configs/moe_tiny.yaml: a Qwen3-MoE of 8 experts (2 per token) on the quickstart's task
    "tiny_moe_warmstart": Recipe(hidden_size=128, num_layers=2, steps=DEFAULT_STEPS, lr=1e-3, family="qwen3_moe"),
}


def build_warmstart(recipe: str, out_dir: str | Path, task_cfg: TaskConfig, seed: int = 0, progress=None) -> Path:
    """Build ``RECIPES[recipe]`` on ``task_cfg``'s train split into ``out_dir``."""
    r = RECIPES[recipe]
    seed = seed if r.seed is None else r.seed
    return build_tiny_math_warmstart(
        out_dir,
        task_cfg,
        steps=r.steps,
        seed=seed,
        lr=r.lr,
        progress=progress,
        hidden_size=r.hidden_size,
        num_layers=r.num_layers,
        batch_size=r.batch_size,
        family=r.family,
    )


def build_tiny_math_warmstart(
    out_dir: str | Path,
    task_cfg: TaskConfig,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    batch_size: int = 64,
    lr: float = 1e-3,
    progress=None,
    hidden_size: int = 128,
    num_layers: int = 2,
    family: str = "qwen2",
) -> Path:
    """Write the warm-started model to ``out_dir`` atomically (build in a sibling, then rename); ``family``: qwen2
    at ``hidden_size`` and ``num_layers``, or a tiny MoE family (``rlx.trainer.tiny.MOE_FAMILIES``, its own shape)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx.tasks import build_task

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    if family == "qwen2":
        build_tiny_model(tmp, hidden_size=hidden_size, num_layers=num_layers, seed=seed)
    else:
        build_tiny_family(tmp, family, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(tmp)
    model = AutoModelForCausalLM.from_pretrained(tmp)
    task = build_task(task_cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # a multi-turn task imitates its whole correct episode (tool call, observation, answer)
        target = getattr(task, "transcript", lambda p: p.answer)
        _train(model, tokenizer, [(p.prompt, target(p)) for p in task.train], steps, seed, batch_size, lr, progress)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(str(tmp), safe_serialization=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def _train(
    model, tokenizer, pairs: list[tuple[str, str]], steps: int, seed: int, batch_size: int, lr: float, progress
) -> None:
    """Next-token loss on the answer and EOS only: the operands are not predictable, the sum is."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()

    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

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
    from rlx.config.task import TaskConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument(
        "--config",
        default="",
        help="a run config: build the model its model.build_if_missing names, on its task and trainer.seed, as "
        "`rlx train` does on its first run (--steps and --seed are then ignored); default: tiny_math's defaults",
    )
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    def progress(step: int, steps: int, loss: float) -> None:
        if step % 50 == 0:
            print(f"step {step}/{steps} loss {loss:.3f}")

    if args.config:
        from rlx.config.load import load_config

        cfg = load_config(args.config)
        if cfg.model.build_if_missing not in RECIPES:
            raise SystemExit(
                f"error: {args.config} has model.build_if_missing={cfg.model.build_if_missing!r}, which is not a "
                f"warm start; pick a config whose model.build_if_missing is one of {', '.join(RECIPES)}"
            )
        build_warmstart(cfg.model.build_if_missing, args.out_dir, cfg.task, seed=cfg.trainer.seed, progress=progress)
        return
    build_tiny_math_warmstart(
        args.out_dir, TaskConfig(name="tiny_math"), steps=args.steps, seed=args.seed, progress=progress
    )


if __name__ == "__main__":
    main()
