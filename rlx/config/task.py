"""The ``task`` section: prompts, ground truth and reward."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlx.config.checks import check_choice, check_range
from rlx.config.errors import ConfigError
from rlx.config.reward_models import RewardModelConfig

TASK_CHOICES = ("tiny_math", "gsm8k", "running_sum", "external", "calc", "reasoning_gym", "openenv")
DATA_FORMAT_CHOICES = ("auto", "jsonl", "parquet", "arrow", "hf_disk", "hub", "verl")


@dataclass
class TaskConfig:
    name: str = "tiny_math"
    """Built-in task: tiny_math (synthetic arithmetic), running_sum, gsm8k (math from a local JSONL/Parquet/
    datasets file), external (episodes an agent records on the rollout servers' OpenAI endpoint) or openenv (episodes
    against an OpenEnv environment server, agent.openenv)."""
    path: str = ""
    """gsm8k: the rows: a local .jsonl, .parquet or .arrow file, a datasets save_to_disk directory, or a Hub dataset
    id (user/name, read through datasets' cache; HF_DATASETS_OFFLINE=1 reads only the cache)."""
    eval_path: str = ""
    """gsm8k: optional held-out file (or Hub id); empty = task.eval_split, else the last task.num_eval rows of
    task.path."""
    split: str = "train"
    """gsm8k: the split of a Hub dataset or a datasets directory of splits that task.path trains on."""
    eval_split: str = ""
    """gsm8k: a split of task.path held out for evaluation (e.g. test); empty = task.eval_path or task.num_eval rows."""
    subset: str = ""
    """gsm8k: a Hub dataset's configuration (subset) name, e.g. main for openai/gsm8k; empty = its default."""
    revision: str = ""
    """gsm8k: a Hub dataset's revision (branch, tag or commit) to read; empty = main (or what the cache holds)."""
    streaming: bool = False
    """gsm8k: read the train split lazily, rows when a step draws them (parquet by row group; arrow, datasets
    directories, Hub ids and JSONL memory-mapped from datasets' arrow files), for sets larger than memory."""
    prompt_template: str = "{question}"
    """Prompt text; {question} is replaced by the question."""
    format: str = "auto"
    """gsm8k: file format of task.path: auto (by suffix; a directory = hf_disk; a file with verl's columns
    data_source, prompt, reward_model and no task.question_key column reads as verl), jsonl, parquet, hf_disk (a
    `datasets` save_to_disk directory) or verl (verl's RL layout: prompt messages, reward_model.ground_truth)."""
    question_key: str = "question"
    """Column holding the question (gsm8k); this and the other column keys take a dotted path into a struct
    column (reward_model.ground_truth)."""
    messages_key: str = ""
    """gsm8k: column holding chat messages [{role, content}] used as the prompt instead of question_key."""
    tools_key: str = ""
    """gsm8k: column holding tool schemas passed to the chat template (apply_chat_template(tools=...))."""
    system_prompt: str = ""
    """gsm8k: system message put first in every prompt (when the row's messages have none)."""
    system_key: str = ""
    """gsm8k: column holding each row's system message (wins over task.system_prompt; empty values fall back to it)."""
    extra_keys: list[str] = field(default_factory=list)
    """gsm8k: columns handed to a user reward by keyword when it takes them, beside data_source and extra_info (a
    dotted key under its last part: meta.level -> level)."""
    chat_template: str = "auto"
    """gsm8k: prompts through the tokenizer's chat template: auto (when it has one), on, or off (plain text)."""
    answer_key: str = "answer"
    """Column holding the ground truth (gsm8k); the number after '####' is used when present."""
    answer_pattern: str = r"(-?\d+(?:\.\d+)?)"
    """Regex whose last match in a completion is taken as the answer (gsm8k)."""
    reward: str = ""
    """User reward as 'module:function' (completion, ground_truth) -> float, given the row's data_source and
    extra_info too if it takes them by keyword, or verl's (data_source, solution_str, ground_truth, extra_info);
    empty = the task's own."""
    reward_timeout_s: float = 1800.0
    """Longest the reward function may take scoring one group (or one step's batch) before the run stops naming it;
    0 = no limit."""
    reward_workers: int = 4
    """Single-turn tasks: groups whose rewards are scored at once, each in its own thread, as the groups finish."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """A learned reward scored over each step's samples: a served judge or a local sequence classifier."""
    num_eval: int = 128
    """Held-out prompts used for evaluation."""
    eval_k: int = 1
    """Samples per held-out prompt for pass@k and maj@k (rlx eval, and every evaluation of rlx train when > 1), drawn at
    the rollout temperature (trainer.eval_temperature when > 0) with fixed seeds; 1 = the greedy accuracy alone."""
    max_operand: int = 30
    """tiny_math, running_sum: operands are drawn from [0, max_operand]."""
    num_examples: int = 2
    """calc on a chat model: worked examples (a tool call, its result, the answer) given as chat turns before the
    question, 0-2."""
    num_terms: int = 8
    """running_sum: numbers to add per problem (the completion grows about 10 tokens a term)."""
    num_train: int = 4096
    """running_sum, reasoning_gym: training problems drawn with task.seed (disjoint from the held-out ones)."""
    operators: str = "+-"
    """tiny_math: operators to draw from (any of '+-*')."""
    seed: int = 0
    """Seed of the dataset split and order; the same seed gives the same prompts."""
    dataset: str = "basic_arithmetic"
    """reasoning_gym: the library's generator (basic_arithmetic, chain_sum, countdown, ...)."""
    dataset_config: dict[str, Any] = field(default_factory=dict)
    """reasoning_gym: options of that generator (e.g. {min_terms: 2, max_terms: 2, max_digits: 2})."""

    def __post_init__(self) -> None:
        check_choice("task.name", self.name, TASK_CHOICES)
        if self.name == "gsm8k" and not self.path:
            raise ConfigError(
                "task.name=gsm8k needs task.path; set it to a local .jsonl, .parquet or .arrow file, a datasets "
                "directory or a Hub dataset id"
            )
        check_choice("task.format", self.format, DATA_FORMAT_CHOICES)
        check_choice("task.chat_template", self.chat_template, ("auto", "on", "off"))
        check_range("task.num_eval", self.num_eval, 0)
        check_range("task.eval_k", self.eval_k, 1)
        if self.eval_path and self.eval_split:
            raise ConfigError(
                f"task.eval_path={self.eval_path!r} and task.eval_split={self.eval_split!r} both name the held-out "
                "rows; set one of them"
            )
        if not self.split:
            raise ConfigError("task.split is empty; name the split task.path trains on (e.g. train)")
        check_range("task.reward_timeout_s", self.reward_timeout_s, 0.0)
        check_range("task.reward_workers", self.reward_workers, 1)
        check_range("task.max_operand", self.max_operand, 1)
        if self.name == "tiny_math":
            check_range(
                "task.max_operand",
                self.max_operand,
                1,
                1000,
                hint="tiny_math builds every a<op>b problem, 3 million at 1000",
            )
        check_range("task.num_terms", self.num_terms, 2)
        check_range("task.num_examples", self.num_examples, 0, 2, hint="calc has two worked examples")
        check_range("task.num_train", self.num_train, 1)
        bad = set(self.operators) - set("+-*")
        if not self.operators or bad:
            raise ConfigError(f"task.operators={self.operators!r}: use a non-empty mix of '+', '-', '*'")
        if self.reward and ":" not in self.reward:
            raise ConfigError(f"task.reward={self.reward!r} must be 'module:function', e.g. 'my_rewards:score'")
