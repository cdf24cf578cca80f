"""Procedural, verifiable tasks from the reasoning-gym library (``task.name=reasoning_gym``).

``task.dataset`` names one of the library's generators (``basic_arithmetic``, ``chain_sum``,
``countdown``, ...) and ``task.dataset_config`` its options; ``task.seed`` draws ``task.num_train``
training and ``task.num_eval`` held-out entries from one seeded dataset (disjoint by construction).
Prompts go through the model's chat template (``task.chat_template``, ``task.system_prompt``,
``task.prompt_template``), as a chat model is asked. A completion's answer is the last match of
``task.answer_pattern`` (the text inside ``<answer>...</answer>`` when the completion has one), and the
library's own ``score_answer`` scores it: the reward is that score, and a score of 1 is correct.

``python -m rlx.tasks.reasoning_gym DATASET FILE`` writes the same entries as JSONL (question, answer) for a
machine without the library, where ``task.name=gsm8k`` reads them (numbers compare as numbers). The
library is an optional dependency: ``pip install reasoning-gym``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlx.config.errors import ConfigError
from rlx.tasks.base import Problem, RewardFn, task_reward
from rlx.tasks.dataset import PromptMaker
from rlx.tasks.gsm8k import extract_answer

if TYPE_CHECKING:
    from rlx.config.task import TaskConfig

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def generated_entries(cfg: TaskConfig) -> tuple:
    """The library's dataset object and its first ``num_train + num_eval`` entries."""
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(
            "task.name=reasoning_gym needs the reasoning-gym library: pip install reasoning-gym "
            "(or export its entries to JSONL where it is installed and use task.name=gsm8k)"
        ) from None
    size = cfg.num_train + cfg.num_eval
    try:
        dataset = reasoning_gym.create_dataset(cfg.dataset, size=size, seed=cfg.seed, **dict(cfg.dataset_config))
    except (KeyError, ValueError, TypeError, AssertionError) as exc:
        raise ConfigError(
            f"reasoning-gym refused task.dataset={cfg.dataset!r} with task.dataset_config="
            f"{dict(cfg.dataset_config)}: {exc}; see reasoning_gym.factory.DATASETS for the names "
            "and each dataset's config class for its options"
        ) from None
    return dataset, [dataset[i] for i in range(size)]


@dataclass
class ReasoningGym:
    train: list[Problem] = field(repr=False)
    eval: list[Problem] = field(repr=False)
    answer_pattern: re.Pattern
    dataset: object = field(repr=False)
    entries: dict[int, dict] = field(repr=False)
    reward_fn: RewardFn | None = None
    name: str = field(default="reasoning_gym", init=False)

    @classmethod
    def from_config(cls, cfg: TaskConfig, reward_fn: RewardFn | None = None, tokenizer_path: str = "") -> ReasoningGym:
        from rlx.tasks.gsm8k import _compile

        dataset, entries = generated_entries(cfg)
        make_prompt = PromptMaker(cfg, tokenizer_path)
        problems = [
            Problem(id=i, prompt=make_prompt({cfg.question_key: e["question"]}, f"entry {i}"), answer=str(e["answer"]))
            for i, e in enumerate(entries)
        ]
        train, eval_ = problems[: cfg.num_train], problems[cfg.num_train :]
        return cls(train, eval_, _compile(cfg.answer_pattern), dataset, dict(enumerate(entries)), reward_fn)

    def score(self, completion: str, problem: Problem) -> float:
        """The library's score of the completion's answer (0 where it gives none)."""
        tagged = ANSWER_TAG.findall(completion)
        answer = tagged[-1].strip() if tagged else extract_answer(completion, self.answer_pattern)
        if answer is None:
            return 0.0
        return float(self.dataset.score_answer(answer, self.entries[problem.id]) or 0.0)

    def is_correct(self, completion: str, problem: Problem) -> bool:
        return self.score(completion, problem) >= 1.0

    def reward(self, completion: str, problem: Problem) -> float:
        if self.reward_fn is not None:
            return task_reward(self.reward_fn, lambda: self.is_correct(completion, problem), completion, problem)
        return self.score(completion, problem)


def export(dataset: str, path: str, num: int, seed: int, config: dict | None = None) -> int:
    """Write ``num`` entries of ``dataset`` as JSONL rows {question, answer}; returns the rows written."""
    import json
    from types import SimpleNamespace

    cfg = SimpleNamespace(dataset=dataset, dataset_config=config or {}, num_train=num, num_eval=0, seed=seed)
    _, entries = generated_entries(cfg)
    with open(path, "w", encoding="utf-8") as f:
        for e in entries:
            f.write(json.dumps({"question": e["question"], "answer": str(e["answer"])}) + "\n")
    return len(entries)


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description="Export reasoning-gym entries as JSONL for task.name=gsm8k")
    parser.add_argument("dataset")
    parser.add_argument("path")
    parser.add_argument("--num", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default="{}", help="the generator's options as JSON (task.dataset_config)")
    args = parser.parse_args()
    print(f"wrote {export(args.dataset, args.path, args.num, args.seed, json.loads(args.config))} rows to {args.path}")
