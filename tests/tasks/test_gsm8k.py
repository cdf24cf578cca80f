"""gsm8k-style tasks from local files: loading, prompt template, answer extraction, splits, errors."""

import json

import pytest

from rlx.config.errors import ConfigError
from rlx.config.task import TaskConfig
from rlx.tasks import build_task

ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "What is 1000 + 234?", "answer": "#### 1,234"},
    {"question": "Half of 5?", "answer": "2.5"},
    {"question": "Ten minus twelve?", "answer": "#### -2"},
]


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


@pytest.fixture
def data(tmp_path):
    return write_jsonl(tmp_path / "train.jsonl", ROWS)


def test_loads_rows_with_template_and_ground_truth_after_hashes(data):
    task = build_task(TaskConfig(name="gsm8k", path=data, num_eval=1, prompt_template="Q: {question}\nA:"))
    assert [p.answer for p in task.train] == ["7", "1234", "2.5"]
    assert task.train[0].prompt == "Q: Tom has 3 apples and buys 4. How many?\nA:"
    assert [(p.id, p.answer) for p in task.eval] == [(3, "-2")]  # the last num_eval rows


@pytest.mark.parametrize(
    "completion, correct",
    [
        ("3 + 4 = 7", True),  # the last number is the answer
        ("7 apples, not 8", False),
        ("The answer is 7.0", True),  # numeric comparison
        ("I think 7", True),
        ("no idea", False),
    ],
)
def test_last_number_in_the_completion_is_compared(data, completion, correct):
    task = build_task(TaskConfig(name="gsm8k", path=data, num_eval=1))
    assert task.is_correct(completion, task.train[0]) is correct
    assert task.reward(completion, task.train[0]) == (1.0 if correct else 0.0)


def test_thousands_separators_and_decimals_and_negatives(data):
    task = build_task(TaskConfig(name="gsm8k", path=data, num_eval=0))
    assert task.is_correct("so 1000 + 234 = 1,234", task.train[1])
    assert task.is_correct("half is 2.50", task.train[2])
    assert task.is_correct("10 - 12 = -2", task.train[3])
    assert not task.is_correct("10 - 12 = 2", task.train[3])


def test_custom_answer_pattern_uses_its_group(data):
    task = build_task(TaskConfig(name="gsm8k", path=data, num_eval=0, answer_pattern=r"\\boxed\{([^}]*)\}"))
    assert task.is_correct(r"7 is wrong... \boxed{8} no: \boxed{7} and then 9", task.train[0])
    assert not task.is_correct("the answer is 7", task.train[0])


def test_eval_path_gives_the_eval_split(tmp_path, data):
    eval_file = write_jsonl(tmp_path / "test.jsonl", [{"q": "1+1?", "a": "#### 2"}, {"q": "2+2?", "a": "4"}])
    train_file = write_jsonl(tmp_path / "train2.jsonl", [{"q": "3+3?", "a": "#### 6"}])
    task = build_task(
        TaskConfig(name="gsm8k", path=train_file, eval_path=eval_file, question_key="q", answer_key="a", num_eval=128)
    )
    assert [(p.id, p.prompt, p.answer) for p in task.train] == [(0, "3+3?", "6")]
    assert [(p.id, p.answer) for p in task.eval] == [(1, "2"), (2, "4")]


def test_missing_file_names_the_path_and_key(tmp_path):
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match=r"task.path=.*nope.jsonl.*set task.path"):
        build_task(TaskConfig(name="gsm8k", path=missing))
    with pytest.raises(FileNotFoundError, match="task.eval_path"):
        build_task(TaskConfig(name="gsm8k", path=write_jsonl(tmp_path / "t.jsonl", ROWS), eval_path=missing))


def test_missing_column_names_the_config_key(data):
    with pytest.raises(ConfigError, match=r"no column 'problem'.*task.question_key"):
        build_task(TaskConfig(name="gsm8k", path=data, question_key="problem", num_eval=0))


def test_bad_json_line_and_bad_format_and_bad_pattern(tmp_path, data):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": "1"}\n{oops\n')
    with pytest.raises(ConfigError, match="line 2 is not valid JSON"):
        build_task(TaskConfig(name="gsm8k", path=str(bad), num_eval=0))
    csv = tmp_path / "data.csv"
    csv.write_text("question,answer\n")
    with pytest.raises(ConfigError, match="use a .jsonl, .parquet or .arrow"):
        build_task(TaskConfig(name="gsm8k", path=str(csv), num_eval=0))
    with pytest.raises(ConfigError, match="task.answer_pattern"):
        build_task(TaskConfig(name="gsm8k", path=data, num_eval=0, answer_pattern="(unclosed"))
    with pytest.raises(ConfigError, match="task.prompt_template"):
        build_task(TaskConfig(name="gsm8k", path=data, num_eval=0, prompt_template="{query}"))
    with pytest.raises(ConfigError, match="task.num_eval=4"):
        build_task(TaskConfig(name="gsm8k", path=data, num_eval=4))


def test_parquet_is_read_with_pyarrow(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    task = build_task(TaskConfig(name="gsm8k", path=str(path), num_eval=1))
    assert [p.answer for p in task.train] == ["7", "1234", "2.5"]


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError("No module named 'pyarrow'")
        return real_import(name, *args, **kwargs)

    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(ConfigError, match="pip install pyarrow"):
        build_task(TaskConfig(name="gsm8k", path=str(path), num_eval=0))
