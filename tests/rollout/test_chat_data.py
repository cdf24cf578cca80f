"""Chat-template prompts and datasets (JSONL, Parquet, datasets directories) with column mapping."""

import json

import pytest

from rlx.config.errors import ConfigError
from rlx.config.task import TaskConfig
from rlx.formats.chat import ChatFormat
from rlx.tasks import build_task
from rlx.tasks.dataset import read_dataset

# Only characters of the tiny tokenizer's alphabet, so every rendered prompt tokenizes without <unk>.
TEMPLATE = (
    "{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}{{ '\n' }}{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}<eos>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
ROWS = [
    {"q": "What is 2+3?", "a": "#### 5", "chat": [{"role": "user", "content": "2+3="}]},
    {"q": "What is 4+4?", "a": "#### 8", "chat": [{"role": "user", "content": "4+4="}]},
]
TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def templated_dir(tmp_path_factory):
    """A tokenizer directory (the tiny character tokenizer) with a chat template set; nothing downloaded."""
    from rlx.trainer.tiny import build_tokenizer

    path = tmp_path_factory.mktemp("templated")
    tokenizer = build_tokenizer(path)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="module")
def plain_tokenizer(tmp_path_factory):
    from rlx.trainer.tiny import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("plain"))


def test_chat_template_renders_system_prompt_tools_and_generation_prompt(templated_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(templated_dir)
    chat = ChatFormat(tokenizer, "auto", system_prompt="Be brief.")
    text = chat.render([{"role": "user", "content": "2+3="}], tools=TOOLS)
    assert chat.kind == "chat_template"
    assert text == "tools: calc\n<system>Be brief.<eos>\n<user>2+3=<eos>\n<assistant>"
    ids = chat.prompt_ids([{"role": "user", "content": "2+3="}])
    assert tokenizer.unk_token_id not in ids and ids.count(tokenizer.eos_token_id) == 2


def test_continuation_keeps_the_models_tokens_and_drops_the_closing_eos_it_sampled(templated_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(templated_dir)
    chat = ChatFormat(tokenizer, "on")
    first = [{"role": "user", "content": "2+3="}]
    answer_ids = tokenizer("5", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    follow_up = first + [{"role": "assistant", "content": "5"}, {"role": "user", "content": "+1="}]
    added = chat.continuation(first, follow_up, "5", answer_ids)
    # the whole follow-up equals the earlier prompt + the sampled ids + what it adds, token for token
    assert chat.prompt_ids(first) + answer_ids + added == chat.prompt_ids(follow_up)
    assert tokenizer.decode(added) == "\n<user>+1=<eos>\n<assistant>"
    rewritten = first + [{"role": "assistant", "content": "6"}, {"role": "user", "content": "+1="}]
    assert chat.continuation(first, rewritten, "5", answer_ids) is None


def test_chat_template_on_without_one_names_the_fix(plain_tokenizer):
    with pytest.raises(ConfigError, match=r"has no chat template; set task.chat_template=off .* or use a tokenizer"):
        ChatFormat(plain_tokenizer, "on")
    chat = ChatFormat(plain_tokenizer, "auto", system_prompt="S:")
    assert chat.kind == "plain" and chat.render([{"role": "user", "content": "1+1="}]) == "S:1+1="


def write_all_formats(tmp_path):
    """The same rows as JSONL, Parquet and a datasets save_to_disk directory."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    disk = tmp_path / "rows_disk"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(disk))
    return {"jsonl": jsonl, "parquet": parquet, "hf_disk": disk}


def test_every_format_with_column_mapping_and_chat_prompts(tmp_path, templated_dir):
    files = write_all_formats(tmp_path)
    for fmt, path in files.items():
        assert read_dataset(str(path)) == ROWS, fmt  # format "auto" picks the reader
        plain = build_task(
            TaskConfig(
                name="gsm8k",
                path=str(path),
                format=fmt,
                question_key="q",
                answer_key="a",
                num_eval=0,
                prompt_template="Q: {question}",
            )
        )
        assert [p.prompt for p in plain.train] == ["Q: What is 2+3?", "Q: What is 4+4?"]
        assert [p.answer for p in plain.train] == ["5", "8"]
        chat = build_task(
            TaskConfig(
                name="gsm8k",
                path=str(path),
                messages_key="chat",
                answer_key="a",
                num_eval=1,
                system_prompt="Add.",
                chat_template="on",
            ),
            tokenizer_path=templated_dir,
        )
        assert chat.train[0].prompt == "<system>Add.<eos>\n<user>2+3=<eos>\n<assistant>"
        assert chat.eval[0].prompt.endswith("<user>4+4=<eos>\n<assistant>") and chat.eval[0].answer == "8"


def test_missing_column_names_the_columns_the_data_has(tmp_path):
    files = write_all_formats(tmp_path)
    for path in files.values():
        with pytest.raises(
            ConfigError, match=r"no column 'question' \(its columns: a, chat, q\); set task.question_key"
        ):
            build_task(TaskConfig(name="gsm8k", path=str(path), num_eval=0, answer_key="a"))
        with pytest.raises(ConfigError, match=r"no column 'msgs'.*set task.messages_key"):
            build_task(TaskConfig(name="gsm8k", path=str(path), num_eval=0, answer_key="a", messages_key="msgs"))


def test_unreadable_data_and_missing_template_fail_with_the_fix(tmp_path, tiny_model_dir):
    not_a_dataset = tmp_path / "empty_dir"
    not_a_dataset.mkdir()
    with pytest.raises(ConfigError, match="is not a datasets save_to_disk directory"):
        read_dataset(str(not_a_dataset))
    garbage = tmp_path / "rows.parquet"
    garbage.write_bytes(b"not parquet")
    with pytest.raises(ConfigError, match="is not a readable Parquet file"):
        read_dataset(str(garbage))
    with pytest.raises(ConfigError, match="task.format=parquet must be a file"):
        read_dataset(str(not_a_dataset), "parquet")
    rows = write_all_formats(tmp_path)["jsonl"]
    cfg = TaskConfig(name="gsm8k", path=str(rows), question_key="q", answer_key="a", num_eval=0, chat_template="on")
    with pytest.raises(ConfigError, match="task.chat_template=on but the tokenizer .* has no chat template"):
        build_task(cfg, tokenizer_path=str(tiny_model_dir))
