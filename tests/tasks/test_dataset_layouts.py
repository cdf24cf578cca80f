"""Datasets as users have them: verl's parquet layout read unchanged, dotted column keys into struct columns,
the data_source / extra_info columns handed to a user reward, and the errors for a missing column or an empty
split. Files are written by ``datasets`` itself."""

import sys
import textwrap

import pytest

from rlx.config.errors import ConfigError
from rlx.config.task import TaskConfig
from rlx.tasks import build_task

datasets = pytest.importorskip("datasets")

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}<eos>\n{% endfor %}<assistant>"


def verl_row(question: str, truth: str, index: int, source: str = "openai/gsm8k") -> dict:
    """A row as verl's examples/data_preprocess/gsm8k.py writes it."""
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": "train", "index": index},
    }


VERL_ROWS = [verl_row("2+3=", "5", 0), verl_row("4+4=", "8", 1), verl_row("9-7=", "2", 2, source="other")]


def to_parquet(rows: list[dict], path) -> str:
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return str(path)


@pytest.fixture(scope="module")
def templated_model(tiny_model_dir, tmp_path_factory):
    """The tiny model's tokenizer with a chat template (its own has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tokenizer.chat_template = TEMPLATE
    path = tmp_path_factory.mktemp("templated")
    tokenizer.save_pretrained(str(path))
    return str(path)


@pytest.fixture
def verl_file(tmp_path):
    return to_parquet(VERL_ROWS, tmp_path / "train.parquet")


@pytest.mark.parametrize("fmt", ["auto", "verl"])
def test_verl_parquet_trains_as_it_is(verl_file, templated_model, fmt):
    task = build_task(TaskConfig(name="gsm8k", path=verl_file, format=fmt, num_eval=1), templated_model)
    assert [p.prompt for p in task.train] == ["<user>2+3=<eos>\n<assistant>", "<user>4+4=<eos>\n<assistant>"]
    assert [p.answer for p in task.train] == ["5", "8"] and task.eval[0].answer == "2"
    assert task.train[1].extra == {"data_source": "openai/gsm8k", "extra_info": {"split": "train", "index": 1}}
    assert task.is_correct("4+4 is 8", task.train[1]) and not task.is_correct("9", task.train[1])


def test_verl_layout_with_a_plain_tokenizer_and_the_users_own_answer_key(verl_file, tiny_model_dir):
    cfg = TaskConfig(name="gsm8k", path=verl_file, num_eval=0, answer_key="extra_info.index")
    task = build_task(cfg, str(tiny_model_dir))  # no chat template: the messages' contents as they are
    assert [p.prompt for p in task.train] == ["2+3=", "4+4=", "9-7="]
    assert [p.answer for p in task.train] == ["0", "1", "2"]  # the key the user set wins over verl's


def test_a_file_with_a_question_column_is_not_taken_for_verl(tmp_path):
    rows = [{**verl_row("2+3=", "5", 0), "question": "What is 2+3?", "answer": "#### 5"}]
    task = build_task(TaskConfig(name="gsm8k", path=to_parquet(rows, tmp_path / "mixed.parquet"), num_eval=0))
    assert task.train[0].prompt == "What is 2+3?" and task.train[0].answer == "5"


def test_nested_keys_reach_into_struct_columns(tmp_path):
    rows = [
        {"item": {"text": "What is 6*7?", "meta": {"gold": "#### 42"}}, "tag": "a"},
        {"item": {"text": "What is 3*3?", "meta": {"gold": "#### 9"}}, "tag": "b"},
    ]
    path = to_parquet(rows, tmp_path / "nested.parquet")
    keys = {"question_key": "item.text", "answer_key": "item.meta.gold"}
    task = build_task(TaskConfig(name="gsm8k", path=path, format="parquet", num_eval=0, **keys))
    assert [(p.prompt, p.answer) for p in task.train] == [("What is 6*7?", "42"), ("What is 3*3?", "9")]


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    """A module of user rewards in each signature rlx calls."""
    (tmp_path / "user_rewards.py").write_text(
        textwrap.dedent(
            """
            def plain(completion, answer):
                return float(answer in completion)

            def named_oddly(completion, data_source):
                return float(data_source == "8")  # its second parameter takes the answer, as before

            def with_source(completion, answer, data_source=None):
                return 1.0 if data_source == "other" else 0.5

            def with_kwargs(completion, answer, **kwargs):
                return float(kwargs["extra_info"]["index"]) + (10.0 if kwargs["data_source"] == "other" else 0.0)

            def compute_score(data_source, solution_str, ground_truth, extra_info=None):
                score = float(ground_truth in solution_str) + extra_info["index"] / 10
                return {"score": score, "source": data_source}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_rewards"
    sys.modules.pop("user_rewards", None)


def test_user_rewards_get_data_source_and_extra_info_when_they_take_them(verl_file, reward_module):
    def rewards(function: str, completion: str) -> list[float]:
        task = build_task(TaskConfig(name="gsm8k", path=verl_file, num_eval=0, reward=f"{reward_module}:{function}"))
        return [task.reward(completion, p) for p in task.train]

    assert rewards("plain", "the answer is 8") == [0.0, 1.0, 0.0]  # the 2-argument signature as before
    assert rewards("named_oddly", "") == [0.0, 1.0, 0.0]
    assert rewards("with_source", "") == [0.5, 0.5, 1.0]
    assert rewards("with_kwargs", "") == [0.0, 1.0, 12.0]
    assert rewards("compute_score", "so 5") == [1.0, 0.1, 0.2]  # verl's own signature, its dict's score


def test_missing_column_names_the_columns_and_the_key(tmp_path, verl_file):
    path = to_parquet([{"q": "2+3=", "a": "5"}], tmp_path / "plain.parquet")
    with pytest.raises(
        ConfigError, match=r"row 0 has no column 'question' \(its columns: a, q\); set task.question_key"
    ):
        build_task(TaskConfig(name="gsm8k", path=path, num_eval=0))
    with pytest.raises(ConfigError, match=r"no column 'prompt' \(its columns: a, q\); set task.messages_key"):
        build_task(TaskConfig(name="gsm8k", path=path, format="verl", num_eval=0))
    cfg = TaskConfig(name="gsm8k", path=verl_file, num_eval=0, answer_key="reward_model.truth")
    with pytest.raises(
        ConfigError, match=r"no column 'reward_model.truth' \(its column 'reward_model' holds: ground_truth, style\)"
    ):
        build_task(cfg)


def test_empty_split_names_the_file_and_the_split(tmp_path, verl_file):
    empty = datasets.Dataset.from_dict({"question": [], "answer": []})
    empty.to_parquet(str(tmp_path / "empty.parquet"))
    empty_path = str(tmp_path / "empty.parquet")
    with pytest.raises(ConfigError, match=r"task.path='.*empty.parquet' \(the train split\) has no rows"):
        build_task(TaskConfig(name="gsm8k", path=empty_path, num_eval=0))
    with pytest.raises(ConfigError, match=r"task.eval_path='.*empty.parquet' \(the eval split\) has no rows"):
        build_task(TaskConfig(name="gsm8k", path=verl_file, eval_path=empty_path, num_eval=0))


def test_errors_come_from_the_pre_flight_task_check(tmp_path, tiny_model_dir):
    from rlx.config.rollout import RolloutConfig
    from rlx.tasks.preflight import check_task

    path = to_parquet([{"q": "2+3=", "a": "5"}], tmp_path / "plain.parquet")
    with pytest.raises(ConfigError, match="set task.question_key"):
        check_task(TaskConfig(name="gsm8k", path=path, num_eval=0), str(tiny_model_dir), RolloutConfig())
