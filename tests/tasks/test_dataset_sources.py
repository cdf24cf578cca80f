"""Datasets as users have them, beyond verl's layout (tests/tasks/test_dataset_layouts.py): a Hub dataset id read
offline from datasets' own cache, an arrow file, a save_to_disk directory of splits, a column map for the system
prompt and the fields a user reward gets, and the lazy (streamed) read of a train split. Every file and the cache
are written by ``datasets`` itself; nothing reaches the network."""

import os
import sys
import textwrap

import pytest

from rlx.config.errors import ConfigError
from rlx.config.task import TaskConfig
from rlx.tasks import DataStream, build_task
from rlx.tasks.dataset import LazyProblems, ParquetRows

datasets = pytest.importorskip("datasets")

ROWS = [{"question": f"{a}+{a}=", "answer": f"#### {2 * a}", "level": a % 3} for a in range(10)]
TEST_ROWS = [
    {"question": "7+8=", "answer": "#### 15", "level": 0},
    {"question": "9+9=", "answer": "#### 18", "level": 1},
]


def columns(rows: list[dict]) -> dict[str, list]:
    return {key: [row[key] for row in rows] for key in rows[0]}


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """datasets' cache holding the Hub set ``me/toy_math`` (subset main: train and test) as ``load_dataset`` leaves it
    after a download, and the environment offline (HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1)."""
    from datasets.packaged_modules.parquet.parquet import Parquet

    cache = tmp_path / "hf_datasets"
    files = {}
    for split, rows in (("train", ROWS), ("test", TEST_ROWS)):
        files[split] = str(tmp_path / f"{split}.parquet")
        datasets.Dataset.from_dict(columns(rows)).to_parquet(files[split])
    builder = Parquet(
        cache_dir=str(cache),
        dataset_name="toy_math",
        config_name="main",
        config_id="main",
        data_files=files,
        hash="0123456789abcdef",
    )
    builder.download_and_prepare()
    # a download names the set's folder namespace___name (the repository me/toy_math); the files keep its name
    os.rename(cache / "toy_math", cache / "me___toy_math")
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_hub_id_reads_offline_from_datasets_cache(hub_cache):
    cfg = TaskConfig(name="gsm8k", path="me/toy_math", subset="main", eval_split="test")
    task = build_task(cfg)
    assert [(p.prompt, p.answer) for p in task.train[:2]] == [("0+0=", "0"), ("1+1=", "2")]
    assert len(task.train) == 10 and [p.answer for p in task.eval] == ["15", "18"]
    held = build_task(TaskConfig(name="gsm8k", path="me/toy_math", num_eval=3))  # the one cached subset
    assert [p.prompt for p in held.eval] == ["7+7=", "8+8=", "9+9="] and len(held.train) == 7


def test_what_the_cache_lacks_is_named(hub_cache):
    with pytest.raises(ConfigError, match=r"subsets 'main', not 'other'; set task.subset"):
        build_task(TaskConfig(name="gsm8k", path="me/toy_math", subset="other", num_eval=1))
    with pytest.raises(ConfigError, match=r"no split 'validation'; its splits: 'train', 'test'"):
        build_task(TaskConfig(name="gsm8k", path="me/toy_math", eval_split="validation"))
    with pytest.raises(
        ConfigError,
        match=r"task.path='me/absent' \(a Hub dataset id.*not in datasets' cache .*"
        r"offline mode is on .*load_dataset\('me/absent'\)",
    ):
        build_task(TaskConfig(name="gsm8k", path="me/absent", num_eval=1))


def test_an_arrow_file_and_a_directory_of_splits(tmp_path):
    data = datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(columns(ROWS)), "test": datasets.Dataset.from_dict(columns(TEST_ROWS))}
    )
    data.save_to_disk(str(tmp_path / "splits"))
    task = build_task(TaskConfig(name="gsm8k", path=str(tmp_path / "splits"), eval_split="test"))
    assert len(task.train) == 10 and [p.answer for p in task.eval] == ["15", "18"]
    swapped = build_task(TaskConfig(name="gsm8k", path=str(tmp_path / "splits"), split="test", num_eval=1))
    assert [p.prompt for p in swapped.train] == ["7+8="]
    with pytest.raises(ConfigError, match=r"holds the splits \['test', 'train'\], not 'dev'; set task.split"):
        build_task(TaskConfig(name="gsm8k", path=str(tmp_path / "splits"), split="dev", num_eval=1))
    arrow = next((tmp_path / "splits" / "test").glob("*.arrow"))  # the arrow file save_to_disk wrote
    task = build_task(TaskConfig(name="gsm8k", path=str(arrow), num_eval=0))
    assert [p.answer for p in task.train] == ["15", "18"]


@pytest.fixture
def level_reward(tmp_path, monkeypatch):
    (tmp_path / "level_rewards.py").write_text(
        textwrap.dedent(
            """
            def by_level(completion, answer, level, data_source=None):
                return float(answer in completion) + level / 10 + (1.0 if data_source else 0.0)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "level_rewards:by_level"
    sys.modules.pop("level_rewards", None)


def test_column_map_system_prompt_and_extra_fields_for_the_reward(tmp_path, level_reward):
    rows = [
        {"q": {"text": "1+1="}, "gold": "2", "sys": "Add.", "meta": {"level": 2}},
        {"q": {"text": "2+5="}, "gold": "7", "sys": "", "meta": {"level": 1}},
    ]
    path = str(tmp_path / "mapped.jsonl")
    datasets.Dataset.from_list(rows).to_json(path)
    keys = {"question_key": "q.text", "answer_key": "gold", "system_key": "sys", "extra_keys": ["meta.level"]}
    cfg = TaskConfig(name="gsm8k", path=path, num_eval=0, system_prompt="Default.", reward=level_reward, **keys)
    task = build_task(cfg)  # no tokenizer: the messages' contents, system first
    assert [p.prompt for p in task.train] == ["Add.1+1=", "Default.2+5="]
    assert task.train[0].extra == {"level": 2}
    assert [task.reward("it is 2", p) for p in task.train] == [pytest.approx(1.2), pytest.approx(0.1)]
    with pytest.raises(
        ConfigError, match=r"no column 'meta.rank' \(its column 'meta' holds: level\); set task.extra_keys"
    ):
        build_task(TaskConfig(name="gsm8k", path=path, num_eval=0, **{**keys, "extra_keys": ["meta.rank"]}))


def test_streaming_reads_row_groups_when_drawn_and_gives_the_same_problems(tmp_path):
    many = [{"question": f"{i}*2=", "answer": f"#### {2 * i}"} for i in range(50)]
    path = str(tmp_path / "many.parquet")
    datasets.Dataset.from_dict(columns(many)).to_parquet(path, batch_size=8)  # row groups of 8 rows
    cfg = TaskConfig(name="gsm8k", path=path, num_eval=5)
    whole, lazy = build_task(cfg), build_task(TaskConfig(**{**cfg.__dict__, "streaming": True}))
    assert isinstance(lazy.train, LazyProblems) and isinstance(lazy.train.rows, ParquetRows)
    assert lazy.train.rows.file.num_row_groups == 7 and len(lazy.train.rows._groups) <= ParquetRows.KEEP_GROUPS
    assert lazy.eval == whole.eval and [p.prompt for p in lazy.eval] == [f"{i}*2=" for i in range(45, 50)]
    drawn = [DataStream(task.train, seed=3).next_batch(60) for task in (whole, lazy)]  # across an epoch
    assert drawn[0] == drawn[1] and len(lazy.train.rows._groups) <= ParquetRows.KEEP_GROUPS
    for other in ("jsonl", "hf_disk"):  # the rest memory-mapped from datasets' arrow files
        source = tmp_path / f"many.{other}"
        data = datasets.Dataset.from_dict(columns(many))
        data.to_json(str(source)) if other == "jsonl" else data.save_to_disk(str(source))
        task = build_task(TaskConfig(name="gsm8k", path=str(source), format=other, num_eval=5, streaming=True))
        assert isinstance(task.train, LazyProblems) and list(task.train) == list(whole.train)


def test_streaming_names_a_row_without_the_column_when_it_is_drawn(tmp_path):
    rows = [{"question": f"{i}+0=", "answer": str(i)} for i in range(300)]
    rows[299] = {"question": "299+0=", "note": "its answer is missing"}
    path = str(tmp_path / "late.parquet")
    datasets.Dataset.from_list(rows).to_parquet(path, batch_size=100)
    task = build_task(TaskConfig(name="gsm8k", path=path, num_eval=0, streaming=True))
    assert task.train[0].answer == "0"  # the first rows were checked when the task was built
    with pytest.raises(ConfigError, match=r"row 299: column 'answer' \(task.answer_key\) is null"):
        task.train[299]


@pytest.mark.slow
def test_rlx_doctor_reads_a_hub_id_from_the_cache_the_environment_names(hub_cache, tiny_model_dir, tmp_path):
    """The environment alone (HF_DATASETS_CACHE, HF_DATASETS_OFFLINE=1) takes a process to the cached set: rlx
    doctor's pre-flight builds the task from it offline; an id the cache lacks is its row's problem."""
    from tests.helpers import start_rlx, stop_group, write_config

    env = {"HF_DATASETS_CACHE": str(hub_cache), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    for path, expected in (("me/toy_math", "no problem found"), ("me/absent", "not in datasets' cache")):
        config = write_config(
            tmp_path / "doctor.yaml",
            tiny_model_dir,
            task={"name": "gsm8k", "path": path, "subset": "main", "eval_split": "test", "chat_template": "off"},
            rollout={"backend": "hf", "max_tokens": 4},
            trainer={"output_dir": str(tmp_path / "run")},
        )
        log = tmp_path / "doctor.log"
        proc = start_rlx(["doctor", str(config)], log, env)
        try:
            proc.wait(300)
        finally:
            stop_group(proc)
        assert expected in " ".join(log.read_text().split()), log.read_text()
