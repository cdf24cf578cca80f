"""gsm8k-style math from a local JSONL / Parquet file or datasets directory, with a configurable prompt
and extraction (reading, column mapping and chat prompts: ``rlx.tasks.dataset``).

Each row has a question (``task.question_key``) and an answer (``task.answer_key``), or is in verl's layout
(``task.format``); the ground truth is the text after the last ``####`` when present (GSM8K's convention), else the
whole answer. The prompt is ``task.prompt_template.format(question=...)`` (or the row's messages, with
``task.messages_key``), through the tokenizer's chat template when ``task.chat_template`` asks. A completion's
answer is the last match of ``task.answer_pattern`` (group 1 if the pattern has a group) after
thousands separators are removed; numbers compare as floats with a 1e-6 tolerance, anything
else as stripped text. The eval split is ``task.eval_path``, or the last ``task.num_eval``
rows of ``task.path``. A row's ``data_source`` and ``extra_info`` columns, when it has them, go to a user reward
that takes them (``rlx.tasks.base.task_reward``). Parquet needs pyarrow. Downloading the dataset is left out:
files are local.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.config.errors import ConfigError
from rlx.tasks.base import REWARD_EXTRAS, Problem, RewardFn, task_reward
from rlx.tasks.dataset import (
    LazyProblems,
    PromptMaker,
    check_columns,
    column,
    read_dataset,
    reward_extras,
    with_layout,
)

if TYPE_CHECKING:
    from rlx.config.task import TaskConfig

THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")


def read_rows(path: str, config_key: str = "task.path", fmt: str = "") -> list[dict]:
    """Rows of a local .jsonl/.json (one object per line) or .parquet file; ``fmt`` (jsonl or parquet)
    overrides the suffix."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(
            f"{config_key}={path!r}: no such file; set {config_key} to a local .jsonl or .parquet file"
        )
    if fmt == "parquet" or (not fmt and file.suffix == ".parquet"):
        return _read_parquet(file, config_key)
    if not fmt and file.suffix not in (".jsonl", ".json"):
        raise ConfigError(f"{config_key}={path!r}: unknown format {file.suffix!r}; use a .jsonl or .parquet file")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{config_key}={path!r} is not UTF-8 text (byte offset {exc.start}); save it as UTF-8 JSON lines"
        ) from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{config_key}={path!r} line {number} is not valid JSON: {exc}") from None
    return rows


def _read_parquet(file: Path, config_key: str) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"reading {file} needs pyarrow: pip install pyarrow (or use a .jsonl file)") from None
    import pyarrow as pa

    try:
        return pq.read_table(file).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise ConfigError(
            f"{config_key}={str(file)!r} is not a readable Parquet file ({str(exc).splitlines()[0]}); "
            "re-copy or re-export it, or give a .jsonl file"
        ) from None


def ground_truth(answer) -> str:
    """The text after the last '####' (else all of it); a number loses its thousands commas."""
    text = str(answer)
    text = (text.rsplit("####", 1)[-1] if "####" in text else text).strip()
    plain = text.replace(",", "")
    try:
        float(plain)
    except ValueError:
        return text
    return plain


def to_problems(
    rows: Sequence[dict],
    cfg: TaskConfig,
    first_id: int,
    config_key: str,
    make_prompt: PromptMaker,
    split: str = "",
    lazy: bool = False,
) -> Sequence[Problem]:
    """The problems of ``rows`` (ids from ``first_id``); ``lazy``: each made when drawn, the columns checked on the
    first ``CHECKED_AHEAD`` rows now and on every row when it is made."""
    path = getattr(cfg, config_key.rsplit(".", maxsplit=1)[-1])  # task.path or task.eval_path
    columns = {**make_prompt.columns(), cfg.answer_key: "task.answer_key"}
    where = f"{config_key}={path!r}"

    def make(row: dict, i: int) -> Problem:
        if lazy:
            check_columns([row], columns, config_key, path, split, first=i)
        return Problem(
            id=first_id + i,
            prompt=make_prompt(row, f"{config_key} row {i}"),
            answer=ground_truth(column(row, cfg.answer_key)),
            source=f"{where} row {i}",
            extra=reward_extras(row, cfg, REWARD_EXTRAS),
        )

    if lazy:
        check_columns(rows[:CHECKED_AHEAD], columns, config_key, path, split)
        return LazyProblems(rows, 0, len(rows), make)
    check_columns(rows, columns, config_key, path, split)
    return [make(row, i) for i, row in enumerate(rows)]


CHECKED_AHEAD = 256
"""task.streaming: rows whose columns are checked when the task is built (each row is checked again when drawn)."""


def extract_answer(completion: str, pattern: re.Pattern) -> str | None:
    """The last match of ``pattern`` in ``completion`` (its group 1 if it has groups), or None."""
    matches = list(pattern.finditer(THOUSANDS.sub("", completion)))
    if not matches:
        return None
    last = matches[-1]
    return last.group(1) if pattern.groups else last.group(0)


def same_answer(predicted: str, truth: str) -> bool:
    try:
        return math.isclose(float(predicted.replace(",", "")), float(truth), rel_tol=1e-6, abs_tol=1e-6)
    except ValueError:
        return predicted.strip() == truth.strip()


@dataclass
class Gsm8k:
    train: Sequence[Problem] = field(repr=False)
    eval: list[Problem] = field(repr=False)
    answer_pattern: re.Pattern
    reward_fn: RewardFn | None = None
    name: str = field(default="gsm8k", init=False)

    @classmethod
    def from_config(cls, cfg: TaskConfig, reward_fn: RewardFn | None = None, tokenizer_path: str = "") -> Gsm8k:
        pattern = _compile(cfg.answer_pattern)
        _check_template(cfg.prompt_template)
        hub = {"subset": cfg.subset, "revision": cfg.revision}
        rows = read_dataset(cfg.path, cfg.format, split=cfg.split, lazy=cfg.streaming, **hub)
        cfg = with_layout(cfg, rows[:1])
        make_prompt = PromptMaker(cfg, tokenizer_path)
        split = cfg.split if cfg.split != "train" else ""
        train = to_problems(rows, cfg, 0, "task.path", make_prompt, split, lazy=cfg.streaming)
        if cfg.eval_path or cfg.eval_split:
            key, where = ("task.eval_path", cfg.eval_path) if cfg.eval_path else ("task.path", cfg.path)
            eval_split = cfg.eval_split or cfg.split
            eval_rows = read_dataset(where, cfg.format, key, split=eval_split, **hub)
            eval_ = to_problems(
                eval_rows, cfg, len(train), key, make_prompt, cfg.eval_split and f"held-out {eval_split}"
            )
        elif cfg.num_eval >= len(train):
            raise ConfigError(
                f"task.num_eval={cfg.num_eval} leaves no training rows out of {len(train)} in "
                f"{cfg.path}; lower task.num_eval or set task.eval_path (or task.eval_split)"
            )
        else:  # the last rows of the file, whatever the order steps draw: the same held-out rows every run
            cut = len(train) - cfg.num_eval
            eval_ = list(train[cut:])
            train = LazyProblems(train.rows, 0, cut, train.make) if cfg.streaming else train[:cut]
        return cls(train, eval_, pattern, reward_fn)

    def answer_of(self, completion: str) -> str | None:
        """The completion's answer as maj@k votes it (a number in one spelling: 7 and 7.0 vote together)."""
        predicted = extract_answer(completion, self.answer_pattern)
        if predicted is None:
            return None
        try:
            return repr(float(predicted.replace(",", "")))
        except ValueError:
            return predicted.strip()

    def is_correct(self, completion: str, problem: Problem) -> bool:
        predicted = extract_answer(completion, self.answer_pattern)
        return predicted is not None and same_answer(predicted, problem.answer)

    def reward(self, completion: str, problem: Problem) -> float:
        return task_reward(self.reward_fn, lambda: self.is_correct(completion, problem), completion, problem)


def _compile(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"task.answer_pattern={pattern!r} is not a valid regular expression: {exc}") from None


def _check_template(template: str) -> None:
    try:
        template.format(question="")
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"task.prompt_template={template!r} cannot be filled: {exc!r}; use {{question}} for "
            "the question and double braces {{{{ }}}} for literal ones"
        ) from None
