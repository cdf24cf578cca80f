"""Prompt datasets as users have them, with column mapping and chat-template prompts.

``read_dataset`` reads the rows of a JSONL file, a Parquet file (pyarrow), an arrow file, a directory written by
``datasets.Dataset.save_to_disk`` (one split, or ``task.split`` of a DatasetDict), or a Hub dataset id
(``user/name``) through ``datasets.load_dataset`` and its cache: with HF_DATASETS_OFFLINE=1 (or HF_HUB_OFFLINE=1)
only the cache is read, and what it lacks (the set, its subset, its split) is named. ``task.format``: auto picks by
suffix, a directory is hf_disk, a path that does not exist and reads as ``user/name`` is hub. ``lazy``
(``task.streaming``) returns a sequence that reads rows when they are asked for: a Parquet file by row group
(``ParquetRows``), the rest memory-mapped from datasets' arrow files (``ArrowRows``; JSONL through datasets' json
builder), so a set larger than memory trains; ``LazyProblems`` makes each ``Problem`` when drawn.
A column key is a column name or a dotted path into a struct column (``reward_model.ground_truth``);
``column`` reads one, ``check_columns`` names the columns a file has when a mapped one is missing.
``with_layout`` maps verl's RL layout (``data_source``, ``prompt`` messages, ``ability``, ``reward_model``
``{style, ground_truth}``, ``extra_info``): with ``task.format=verl``, or with auto when the file has verl's
columns and no ``task.question_key`` column.
``PromptMaker`` turns a row into prompt text: the row's chat messages (``task.messages_key``)
or the question filled into ``task.prompt_template`` as one user message, with the row's system message
(``task.system_key``) or ``task.system_prompt`` and the row's tool schemas (``task.tools_key``), through the
tokenizer's chat template or as plain text (``rlx.formats.chat.ChatFormat``). ``reward_extras`` picks the columns a
user reward is handed. Downloading is ``datasets``' own (online, into its cache); nothing else reaches the network.
"""

from __future__ import annotations

import bisect
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlx.config.errors import ConfigError
from rlx.formats.chat import ChatFormat

if TYPE_CHECKING:
    from rlx.config.task import TaskConfig
    from rlx.tasks.base import Problem

SUFFIX_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".arrow": "arrow"}
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+|[A-Za-z0-9][\w-]*")
"""What a Hub dataset id looks like (``user/name``, or a bare canonical ``name``)."""
VERL_COLUMNS = ("data_source", "prompt", "reward_model")
"""The columns that mark a file in verl's RL layout (its ``ability`` and ``extra_info`` are not needed)."""
VERL_KEYS = {"messages_key": "prompt", "answer_key": "reward_model.ground_truth"}
"""Where verl's layout keeps the prompt messages and the ground truth."""
MAY_BE_NULL = ("task.tools_key", "task.system_key", "task.extra_keys")
"""Columns a row may hold null in (no tools, the default system prompt, a reward's missing field)."""
PLACES = "a local .jsonl, .parquet or .arrow file, a datasets save_to_disk directory or a Hub dataset id (user/name)"


def read_dataset(
    path: str,
    fmt: str = "auto",
    config_key: str = "task.path",
    split: str = "train",
    subset: str = "",
    revision: str = "",
    lazy: bool = False,
) -> Sequence[dict]:
    """Rows (dicts) of ``path`` in format ``fmt`` (auto, jsonl, parquet, arrow, hf_disk, hub or verl): a list, or
    with ``lazy`` a sequence that reads them when asked. ``split``, ``subset`` and ``revision`` choose among a Hub
    dataset's (``split`` also among a datasets directory's splits)."""
    fmt = data_format(path, fmt, config_key)
    file = Path(path).expanduser()
    try:
        if fmt == "hub":
            return _read_hub(path, subset, split, revision, config_key, lazy)
        if fmt == "hf_disk":
            return _read_hf_disk(file, config_key, split, lazy)
        with open(file, "rb"):  # an unreadable file is named here, not deep inside a reader
            pass
        if fmt == "arrow":
            return _as_rows(_datasets(f"reading {file}").Dataset.from_file(str(file)), lazy)
        if lazy and fmt == "parquet":
            return ParquetRows(file, config_key)
        if lazy:  # JSONL: datasets' json builder writes it once as arrow files that are memory-mapped
            return ArrowRows(_datasets(f"reading {file} lazily").load_dataset("json", data_files=str(file))["train"])
        from rlx.tasks.gsm8k import read_rows

        return read_rows(str(file), config_key, fmt)
    except PermissionError:
        raise ConfigError(
            f"{config_key}={path!r} is not readable (permission denied); fix its permissions or "
            "copy it somewhere you can read"
        ) from None


def data_format(path: str, fmt: str, config_key: str) -> str:
    """The reader ``path`` takes: ``fmt``, or for auto and verl what the path is (verl names the columns' layout;
    the file's type is told as for auto)."""
    file = Path(path).expanduser()
    if fmt == "hub":
        return fmt
    if not file.exists():
        if fmt in ("auto", "verl") and HUB_ID.fullmatch(path) and file.suffix not in SUFFIX_FORMATS:
            return "hub"
        raise FileNotFoundError(f"{config_key}={path!r}: no such file or directory; set {config_key} to {PLACES}")
    if fmt in ("auto", "verl"):
        fmt = "hf_disk" if file.is_dir() else SUFFIX_FORMATS.get(file.suffix, "")
        if not fmt:
            raise ConfigError(
                f"{config_key}={path!r}: cannot tell the format from {file.suffix!r}; use a .jsonl, .parquet or "
                ".arrow file, or set task.format to jsonl, parquet, arrow or hf_disk"
            )
    if (fmt == "hf_disk") != file.is_dir():
        want = "a directory written by datasets' save_to_disk" if fmt == "hf_disk" else "a file"
        raise ConfigError(f"{config_key}={path!r} with task.format={fmt} must be {want}; fix task.format or the path")
    return fmt


def _datasets(what: str):
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            f"{what} needs the datasets library: pip install 'rlx[data]' (or pip install datasets)"
        ) from None
    return datasets


def _as_rows(data, lazy: bool) -> Sequence[dict]:
    return ArrowRows(data) if lazy else data.to_list()


def _read_hf_disk(directory: Path, config_key: str, split: str, lazy: bool) -> Sequence[dict]:
    datasets = _datasets(f"reading {directory} (task.format=hf_disk)")
    try:
        data = datasets.load_from_disk(str(directory))
    except (FileNotFoundError, ValueError, OSError) as exc:
        raise ConfigError(
            f"{config_key}={str(directory)!r} is not a datasets save_to_disk directory "
            f"({str(exc).splitlines()[0]}); write it with Dataset.save_to_disk"
        ) from None
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            key = "task.split" if config_key == "task.path" else "task.eval_split"
            raise ConfigError(
                f"{config_key}={str(directory)!r} holds the splits {sorted(data)}, not {split!r}; set {key} to one "
                f"of them, or point {config_key} at one split's directory, e.g. {directory / next(iter(data))}"
            )
        data = data[split]
    return _as_rows(data, lazy)


def _read_hub(name: str, subset: str, split: str, revision: str, config_key: str, lazy: bool) -> Sequence[dict]:
    """A Hub dataset's split through ``datasets.load_dataset`` (its cache, offline when the environment says)."""
    datasets = _datasets(f"reading the Hub dataset {name!r}")
    what = f"{config_key}={name!r} (a Hub dataset id; subset {subset or 'default'}, split {split}" + (
        f", revision {revision})" if revision else ")"
    )
    try:
        data = datasets.load_dataset(name, subset or None, split=split, revision=revision or None)
    except (ConnectionError, FileNotFoundError, ValueError, OSError) as exc:
        raise ConfigError(f"{what}: {_hub_problem(name, subset, exc)}") from None
    return _as_rows(data, lazy)


def _hub_problem(name: str, subset: str, exc: BaseException) -> str:
    """What the cache lacks, in words, with the fix (from ``load_dataset``'s error)."""
    import datasets

    text = " ".join(str(exc).split())
    cache = datasets.config.HF_DATASETS_CACHE
    offline = datasets.config.HF_HUB_OFFLINE
    if found := re.search(r"Available configs in the cache: \[(.*?)\]", text):
        return (
            f"datasets' cache ({cache}) holds {name} with the subsets {found.group(1)}, not {subset or 'default'!r}; "
            "set task.subset to one of them, or load that subset once online"
        )
    if found := re.search(r"Unknown split \"(.*?)\"\. Should be one of \[(.*?)\]", text):
        return f"it has no split {found.group(1)!r}; its splits: {found.group(2)}; set task.split or task.eval_split"
    if offline and ("Couldn't reach" in text or "not cached" in text or "Couldn't find cache" in text):
        return (
            f"it is not in datasets' cache ({cache}) and offline mode is on (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE), "
            f"nor is there a local file or directory of that name; load it once where the Hub is reachable, with the "
            f'same HF_HOME (python -c "import datasets; datasets.load_dataset({name!r}'
            f'{", " + repr(subset) if subset else ""})"), or set task.path to {PLACES}'
        )
    return f"datasets could not load it ({text[:300]}); check the id and the network, or set task.path to {PLACES}"


class ArrowRows(Sequence):
    """The rows of a ``datasets.Dataset``, read from its memory-mapped arrow files when asked for."""

    def __init__(self, data) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self.data[i] for i in range(*index.indices(len(self)))]
        return self.data[range(len(self))[index]]


class ParquetRows(Sequence):
    """The rows of a Parquet file, read one row group at a time when asked for (the newest few groups kept)."""

    KEEP_GROUPS = 2

    def __init__(self, file: Path, config_key: str) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            self.file = pq.ParquetFile(file)
        except (pa.ArrowException, OSError) as exc:
            raise ConfigError(
                f"{config_key}={str(file)!r} is not a readable Parquet file ({str(exc).splitlines()[0]}); "
                "re-copy or re-export it"
            ) from None
        sizes = [self.file.metadata.row_group(g).num_rows for g in range(self.file.num_row_groups)]
        self.starts = [sum(sizes[:g]) for g in range(len(sizes))]
        self.num_rows = sum(sizes)
        self._groups: dict[int, list[dict]] = {}
        self._lock = threading.Lock()  # the controller's loop and a fully_async producer may both draw

    def __len__(self) -> int:
        return self.num_rows

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = range(self.num_rows)[index]
        group = bisect.bisect_right(self.starts, index) - 1
        with self._lock:
            rows = self._groups.pop(group, None)
            if rows is None:
                rows = self.file.read_row_group(group).to_pylist()
            self._groups[group] = rows  # the newest last
            while len(self._groups) > self.KEEP_GROUPS:
                self._groups.pop(next(iter(self._groups)))
        return rows[index - self.starts[group]]


class LazyProblems(Sequence):
    """Problems ``start .. stop`` of ``rows``, each made (``make(row, position)``) when asked for."""

    def __init__(self, rows: Sequence[dict], start: int, stop: int, make: Callable[[dict, int], Problem]) -> None:
        self.rows, self.start, self.stop, self.make = rows, start, stop, make

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        position = self.start + range(len(self))[index]
        return self.make(self.rows[position], position)


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


def check_columns(
    rows: Sequence[dict], columns: dict[str, str], config_key: str, path: str, split: str = "", first: int = 0
) -> None:
    """``path`` has rows, and every row has each mapped column (``columns``: column key -> the config key
    naming it); ``first``: the position of ``rows[0]`` in its file, for the error."""
    if not rows:
        split = split or ("eval" if config_key == "task.eval_path" else "train")
        raise ConfigError(
            f"{config_key}={path!r} (the {split} split) has no rows; point {config_key} at a file with at least one row"
        )
    for i, row in enumerate(rows, start=first):
        for key, config in columns.items():
            if found := _missing(row, key):
                raise ConfigError(
                    f"{config_key}={path!r} row {i} has no column {key!r} ({found}); set {config} to the "
                    "column that holds it (a dotted path reaches into a struct column, e.g. reward_model.ground_truth)"
                )
            if config not in MAY_BE_NULL and column(row, key) is None:  # datasets writes a row without it as null
                raise ConfigError(
                    f"{config_key}={path!r} row {i}: column {key!r} ({config}) is null; fill it in or drop the row"
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
        for key, config in ((c.tools_key, "task.tools_key"), (c.system_key, "task.system_key")):
            if key:
                wanted[key] = config
        wanted.update({key: "task.extra_keys" for key in c.extra_keys})
        return wanted

    def __call__(self, row: dict, where: str) -> str:
        c = self.cfg
        tools = column(row, c.tools_key) if c.tools_key else None
        system = column(row, c.system_key) if c.system_key else ""
        if c.messages_key:
            messages = column(row, c.messages_key)
            if not (isinstance(messages, list) and all(isinstance(m, dict) and "role" in m for m in messages)):
                raise ConfigError(
                    f"{where}: column {c.messages_key!r} (task.messages_key) must hold a list of "
                    "{role, content} messages"
                )
        else:
            messages = [{"role": "user", "content": c.prompt_template.format(question=column(row, c.question_key))}]
        if system and not (messages and messages[0].get("role") == "system"):
            messages = [{"role": "system", "content": str(system)}, *messages]
        return self.chat.render(messages, tools)


def reward_extras(row: dict, cfg: TaskConfig, extras: Sequence[str]) -> dict[str, Any]:
    """What a user reward may be handed of ``row``: its ``extras`` columns it has (data_source, extra_info) and
    ``task.extra_keys`` (a dotted key under its last part)."""
    found = {key: row[key] for key in extras if key in row}
    found.update({key.rsplit(".", 1)[-1]: column(row, key) for key in cfg.extra_keys})
    return found
