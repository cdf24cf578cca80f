"""Prompt datasets from local files, with column mapping and chat-template prompts.

``read_dataset`` reads the rows of a JSONL file, a Parquet file (pyarrow) or a directory written
by ``datasets.Dataset.save_to_disk`` (``task.format``: auto picks by suffix, a directory is
hf_disk). A column key is a column name or a dotted path into a struct column (``reward_model.ground_truth``);
``column`` reads one, ``check_columns`` names the columns a file has when a mapped one is missing.
``with_layout`` maps verl's RL layout (``data_source``, ``prompt`` messages, ``ability``, ``reward_model``
``{style, ground_truth}``, ``extra_info``): with ``task.format=verl``, or with auto when the file has verl's
columns and no ``task.question_key`` column.
``PromptMaker`` turns a row into prompt text: the row's chat messages (``task.messages_key``)
or the question filled into ``task.prompt_template`` as one user message, with
``task.system_prompt`` and the row's tool schemas (``task.tools_key``), through the tokenizer's
chat template or as plain text (``rlx.formats.chat.ChatFormat``). Downloads are left out: data is local.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlx.config.errors import ConfigError
from rlx.formats.chat import ChatFormat

if TYPE_CHECKING:
    from rlx.config.task import TaskConfig

SUFFIX_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
VERL_COLUMNS = ("data_source", "prompt", "reward_model")
"""The columns that mark a file in verl's RL layout (its ``ability`` and ``extra_info`` are not needed)."""
VERL_KEYS = {"messages_key": "prompt", "answer_key": "reward_model.ground_truth"}
"""Where verl's layout keeps the prompt messages and the ground truth."""


def read_dataset(path: str, fmt: str = "auto", config_key: str = "task.path") -> list[dict]:
    """Rows (dicts) of ``path`` in format ``fmt`` (auto, jsonl, parquet or hf_disk)."""
    from rlx.tasks.gsm8k import read_rows

    file = Path(path).expanduser()
    if not file.exists():
        raise FileNotFoundError(
            f"{config_key}={path!r}: no such file or directory; set {config_key} to a local "
            ".jsonl or .parquet file or a datasets save_to_disk directory"
        )
    if fmt in ("auto", "verl"):  # verl names the columns' layout; the file's type is told as for auto
        fmt = "hf_disk" if file.is_dir() else SUFFIX_FORMATS.get(file.suffix, "")
        if not fmt:
            raise ConfigError(
                f"{config_key}={path!r}: cannot tell the format from {file.suffix!r}; use a .jsonl or "
                ".parquet file, or set task.format to jsonl, parquet or hf_disk"
            )
    if (fmt == "hf_disk") != file.is_dir():
        want = "a directory written by datasets' save_to_disk" if fmt == "hf_disk" else "a file"
        raise ConfigError(f"{config_key}={path!r} with task.format={fmt} must be {want}; fix task.format or the path")
    try:
        if fmt == "hf_disk":
            return _read_hf_disk(file, config_key)
        with open(file, "rb"):  # an unreadable file is named here, not deep inside a reader
            pass
        return read_rows(str(file), config_key, fmt)
    except PermissionError:
        raise ConfigError(
            f"{config_key}={path!r} is not readable (permission denied); fix its permissions or "
            "copy it somewhere you can read"
        ) from None


def _read_hf_disk(directory: Path, config_key: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            f"reading {directory} (task.format=hf_disk) needs the datasets library: "
            "pip install 'rlx[data]' (or pip install datasets)"
        ) from None
    try:
        data = datasets.load_from_disk(str(directory))
    except (FileNotFoundError, ValueError, OSError) as exc:
        raise ConfigError(
            f"{config_key}={str(directory)!r} is not a datasets save_to_disk directory "
            f"({str(exc).splitlines()[0]}); write it with Dataset.save_to_disk"
        ) from None
    if isinstance(data, datasets.DatasetDict):
        raise ConfigError(
            f"{config_key}={str(directory)!r} holds the splits {sorted(data)}; point {config_key} at "
            f"one split's directory, e.g. {directory / next(iter(data))}"
        )
    return data.to_list()


def column(row: dict, key: str) -> Any:
    """The value of ``key`` in ``row``: a column, or a dotted path into struct columns; a column whose own name
    has the dot wins."""
    if key in row:
        return row[key]
    value = row
    for part in key.split("."):
        value = value[part]
    return value


def _missing(row: Any, key: str) -> str:
    """Empty when ``row`` has ``key``, else what it holds where the key's path breaks."""
    if not isinstance(row, dict):
        return f"the row is a {type(row).__name__}, not an object"
    if key in row:
        return ""
    value, walked = row, []
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            if not walked:
                return f"its columns: {', '.join(sorted(row))}"
            held = ", ".join(sorted(value)) if isinstance(value, dict) else f"a {type(value).__name__}, not a struct"
            return f"its column {'.'.join(walked)!r} holds: {held}"
        value = value[part]
        walked.append(part)
    return ""


def check_columns(rows: list[dict], columns: dict[str, str], config_key: str, path: str) -> None:
    """``path`` has rows, and every row has each mapped column (``columns``: column key -> the config key
    naming it)."""
    if not rows:
        split = "eval" if config_key == "task.eval_path" else "train"
        raise ConfigError(
            f"{config_key}={path!r} (the {split} split) has no rows; point {config_key} at a file with at least one row"
        )
    for i, row in enumerate(rows):
        for key, config in columns.items():
            if found := _missing(row, key):
                raise ConfigError(
                    f"{config_key}={path!r} row {i} has no column {key!r} ({found}); set {config} to the "
                    "column that holds it (a dotted path reaches into a struct column, e.g. reward_model.ground_truth)"
                )


def with_layout(cfg: TaskConfig, rows: list[dict]) -> TaskConfig:
    """``cfg`` with verl's column keys where the task reads verl's layout (``task.format=verl``, or auto and
    the first row has verl's columns but no ``task.question_key``); keys the user set keep their value."""
    first = rows[0] if rows and isinstance(rows[0], dict) else {}
    detected = set(VERL_COLUMNS) <= set(first) and cfg.question_key not in first and not cfg.messages_key
    if cfg.format != "verl" and not (cfg.format == "auto" and detected):
        return cfg
    answer_key = VERL_KEYS["answer_key"] if cfg.answer_key == "answer" else cfg.answer_key
    return replace(cfg, messages_key=cfg.messages_key or VERL_KEYS["messages_key"], answer_key=answer_key)


class PromptMaker:
    """Row -> prompt text, from the task config's column mapping and chat settings."""

    def __init__(self, cfg: TaskConfig, tokenizer_path: str = "") -> None:
        tokenizer = None
        if cfg.chat_template != "off" and tokenizer_path:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        elif cfg.chat_template == "on":
            raise ConfigError("task.chat_template=on needs the model's tokenizer; build the task with model.path set")
        self.chat = ChatFormat(tokenizer, cfg.chat_template, cfg.system_prompt)
        self.cfg = cfg

    def columns(self) -> dict[str, str]:
        """The columns prompts are made from, each with the config key that names it."""
        c = self.cfg
        wanted = {c.messages_key: "task.messages_key"} if c.messages_key else {c.question_key: "task.question_key"}
        if c.tools_key:
            wanted[c.tools_key] = "task.tools_key"
        return wanted

    def __call__(self, row: dict, where: str) -> str:
        c = self.cfg
        tools = column(row, c.tools_key) if c.tools_key else None
        if c.messages_key:
            messages = column(row, c.messages_key)
            if not (isinstance(messages, list) and all(isinstance(m, dict) and "role" in m for m in messages)):
                raise ConfigError(
                    f"{where}: column {c.messages_key!r} (task.messages_key) must hold a list of "
                    "{role, content} messages"
                )
        else:
            messages = [{"role": "user", "content": c.prompt_template.format(question=column(row, c.question_key))}]
        return self.chat.render(messages, tools)
