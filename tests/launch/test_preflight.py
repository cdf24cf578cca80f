"""`rlx train` pre-flight: broken input fails as one `error:` line (exit 2) before any process starts
and before anything is written into the run directory."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlx.cli import app
from tests.helpers import write_config

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def train(config: Path, *overrides: str) -> tuple[int, str]:
    result = runner.invoke(app, ["train", str(config), *overrides])
    return result.exit_code, result.output


def assert_refused_before_start(code: int, output: str, run_dir: Path, *fragments: str) -> None:
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    for fragment in fragments:
        assert fragment in output, output
    assert not (run_dir / "logs").exists() and not (run_dir / "config.yaml").exists(), "something was started"


@pytest.fixture
def config(tmp_path, tiny_model_dir):
    return write_config(
        tmp_path / "run.yaml", tiny_model_dir, rollout={"backend": "hf"}, trainer={"output_dir": str(tmp_path / "run")}
    )


def test_output_dir_that_is_a_file_or_under_one(config, tmp_path):
    (tmp_path / "taken").write_text("not a directory")
    code, output = train(config, f"trainer.output_dir={tmp_path / 'taken'}")
    assert_refused_before_start(code, output, tmp_path / "run", "trainer.output_dir=", "is a file")
    code, output = train(config, f"trainer.output_dir={tmp_path / 'taken' / 'run'}")
    assert_refused_before_start(code, output, tmp_path / "run", "which is a file", "set trainer.output_dir")
    assert (tmp_path / "taken").read_text() == "not a directory"


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("data.parquet", b"PAR1 not really parquet PAR1", "is not a readable Parquet file"),
        ("data.jsonl", b'{"question": "1+1", "answer": "2"}\n{"question": "\xff\xfe"}\n', "is not UTF-8 text"),
        ("data.jsonl", b'{"question": "1+1", "answer": "2"}\n{"question": \n', "line 2 is not valid JSON"),
    ],
)
def test_unreadable_task_file(config, tmp_path, name, content, expected):
    data = tmp_path / name
    data.write_bytes(content)
    code, output = train(config, "task.name=gsm8k", f"task.path={data}")
    assert_refused_before_start(code, output, tmp_path / "run", "task.path=", expected)


@pytest.mark.parametrize(
    "source, spec, expected",
    [
        ("def score(completion, answer:\n    return 1.0\n", "broken_syntax:score", "SyntaxError"),
        ("raise RuntimeError('no GPU here')\n", "raises_on_import:score", "RuntimeError: no GPU here"),
        ("import no_such_dependency_xyz\n", "needs_missing_dep:score", "No module named 'no_such_dependency_xyz'"),
        ("", ".relative:score", "is a relative module name"),
    ],
)
def test_reward_module_that_cannot_be_imported(config, tmp_path, source, spec, expected):
    module_dir = tmp_path / "rewards"
    module_dir.mkdir()
    module = spec.split(":")[0].lstrip(".")
    (module_dir / f"{module}.py").write_text(source)
    sys.path.insert(0, str(module_dir))  # CliRunner runs in this process: make the module importable here
    try:
        code, output = train(config, f"task.reward={spec}")
    finally:
        sys.path.remove(str(module_dir))
        sys.modules.pop(module, None)
    assert_refused_before_start(code, output, tmp_path / "run", f"task.reward='{spec}'", expected)
    if not spec.startswith("."):
        assert f"{module}.py:" in output  # the file and line to fix


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda d: [p.unlink() for p in d.glob("*.safetensors")], "has config.json but no weights"),
        (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-64]), "is truncated"),
        (lambda d: (d / "config.json").write_text("{oops"), "config.json is not valid JSON"),
        (lambda d: [(d / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")], "has no tokenizer"),
    ],
)
def test_incomplete_model_directory(config, tmp_path, tiny_model_dir, damage, expected):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    damage(model)
    code, output = train(config, f"model.path={model}")
    assert_refused_before_start(code, output, tmp_path / "run", expected)


def test_a_sound_model_directory_passes(tiny_model_dir):
    from rlx.trainer.model import check_model_dir

    assert check_model_dir(str(tiny_model_dir)) == Path(tiny_model_dir)


def test_an_output_dir_with_a_name_too_long_for_the_file_system_is_refused(tmp_path):
    from rlx.config.errors import ConfigError
    from rlx.launch.preflight import check_output_dir

    with pytest.raises(ConfigError, match="a name of 300 bytes .* file systems allow 255"):
        check_output_dir(tmp_path / ("x" * 300) / "run")


def test_a_dataset_prompt_longer_than_the_context_names_its_file_and_row(config, tmp_path):
    data = tmp_path / "data.jsonl"
    rows = (
        [{"question": "1+1", "answer": "2"}] * 3
        + [{"question": "1+" * 300, "answer": "2"}]
        + [{"question": "2+2", "answer": "4"}]
        + [{"question": "3+" * 400, "answer": "3"}]
    )
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    code, output = train(
        config,
        "task.name=gsm8k",
        f"task.path={data}",
        "task.num_eval=1",
        "task.chat_template=off",
        "rollout.max_model_len=512",
    )
    assert_refused_before_start(
        code,
        output,
        tmp_path / "run",
        f"task.path={str(data)!r} row 3: the prompt is 600 tokens",
        "rollout.max_model_len=512",
        "1 more prompts are too long, the longest 800",
        "raise rollout.max_model_len above 800",
    )
    data.write_text("".join(json.dumps(row) + "\n" for row in rows[:3]))  # the train rows fit; one held-out does not
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[-1]) + "\n")
    code, output = train(
        config,
        "task.name=gsm8k",
        f"task.path={data}",
        f"task.eval_path={held_out}",
        "task.chat_template=off",
        "rollout.max_model_len=700",
    )
    assert_refused_before_start(
        code,
        output,
        tmp_path / "run",
        f"task.eval_path={str(held_out)!r} row 1: the prompt is 800 tokens",
        "raise rollout.max_model_len above 800",
    )


def test_a_missing_teacher_names_how_to_build_it(config, tmp_path):
    code, output = train(config, f"algorithm.distill.teacher={tmp_path / 'teacher'}")
    assert_refused_before_start(
        code,
        output,
        tmp_path / "run",
        "algorithm.distill.teacher=",
        "no config.json",
        "algorithm.distill.teacher_build_if_missing=tiny_math_teacher",
    )


def test_the_teacher_is_built_when_missing(config, tmp_path, monkeypatch):
    """The distillation quickstart's teacher is built in pre-flight, as the student is (the recipe cut to a few
    steps here: the real one trains 1600), and the note says where, as an absolute path."""
    import io

    from rich.console import Console

    from rlx.config import load_config
    from rlx.launch.display import Display
    from rlx.launch.preflight import preflight
    from rlx.trainer import warmstart

    monkeypatch.setitem(
        warmstart.RECIPES,
        "tiny_math_teacher",
        warmstart.Recipe(hidden_size=128, num_layers=2, steps=3, lr=1e-3, seed=1),
    )
    monkeypatch.chdir(tmp_path)
    cfg = load_config(
        str(config),
        ["algorithm.distill.teacher=models/teacher", "algorithm.distill.teacher_build_if_missing=tiny_math_teacher"],
    )
    out = io.StringIO()
    preflight(cfg, Display(1, console=Console(file=out, width=200)))
    assert (tmp_path / "models" / "teacher" / "config.json").is_file()
    assert f"building the teacher into {tmp_path / 'models' / 'teacher'}" in out.getvalue()


@pytest.mark.parametrize("model", ["tiny_model_dir", "smollm2_dir"])
def test_the_bound_on_a_prompts_tokens_holds_for_real_tokenizers(model, request):
    """Pre-flight skips counting when every prompt's bound (bytes x TOKENS_PER_BYTE_BOUND + SPECIAL_TOKENS_BOUND)
    fits; the bound must hold: here against the tiny model's and SmolLM2's tokenizers, special tokens included."""
    from rlx.tasks.preflight import SPECIAL_TOKENS_BOUND, TOKENS_PER_BYTE_BOUND
    from rlx.trainer.model import load_tokenizer

    tokenizer = load_tokenizer(str(request.getfixturevalue(model)))
    texts = [
        "12+7=",
        "",
        " ",
        "  leading spaces and a tab\tand unicode: café, 数学, 한국어, 🙂🙂🙂",
        "<|im_start|>user\nWhat is 47*38?<|im_end|>\n<|im_start|>assistant\n",
        "\x00\x01\x7f" * 20,
        "word " * 300,
    ]
    for special in (True, False):
        counts = [len(ids) for ids in tokenizer(texts, add_special_tokens=special)["input_ids"]]
        for text, count in zip(texts, counts, strict=True):
            assert count <= TOKENS_PER_BYTE_BOUND * len(text.encode()) + SPECIAL_TOKENS_BOUND, (text, count)


def test_short_prompts_are_checked_without_loading_the_tokenizer(tiny_model_dir, tmp_path):
    """The quickstart's prompts are a few bytes: pre-flight passes them without importing transformers (seconds
    of the run's start); a prompt near the limit is counted (the refusals above)."""
    import subprocess

    script = (
        "import sys\n"
        "from rlx.config import load_config\n"
        "from rlx.tasks.preflight import check_prompts\n"
        "from rlx.tasks import build_task\n"
        f"cfg = load_config({str(ROOT / 'configs' / 'quickstart.yaml')!r}, ['model.path={tiny_model_dir}'])\n"
        "check_prompts(build_task(cfg.task, cfg.model.path), cfg.model.path, cfg.rollout)\n"
        "print('transformers' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "False"


def test_a_tensor_parallel_size_that_does_not_split_the_heads_is_refused(tiny_model_dir, tmp_path):
    """vLLM splits attention heads evenly over the engine's GPUs: a size that does not divide them is refused
    in pre-flight, naming the sizes that do (SmolLM2-135M has 9 heads: TP=2 cannot serve it)."""
    from rlx.config import load_config
    from rlx.config.errors import ConfigError
    from rlx.config.roles import rollout_role
    from rlx.rollout.preflight import check_rollout

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["num_attention_heads"] = 9
    (model / "config.json").write_text(json.dumps(config))
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", [f"model.path={model}", "rollout.backend=vllm"])
    cfg.rollout.tensor_parallel_size = 2
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=2 does not divide the 9 attention heads.*\(1, 3\)"):
        check_rollout(rollout_role(cfg))
    cfg.rollout.tensor_parallel_size = 3
    check_rollout(rollout_role(cfg))  # 9 heads split over 3


def test_a_context_longer_than_the_models_positions_is_refused(tiny_model_dir, tmp_path):
    """vLLM refuses a max_model_len beyond max_position_embeddings (a validation traceback from the server, after
    its imports): pre-flight says so first, naming the length that fits."""
    from rlx.config import load_config
    from rlx.config.errors import ConfigError
    from rlx.config.roles import rollout_role
    from rlx.rollout.preflight import check_rollout

    positions = json.loads((tiny_model_dir / "config.json").read_text())["max_position_embeddings"]
    overrides = [f"model.path={tiny_model_dir}", "rollout.backend=vllm"]
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", [*overrides, f"rollout.max_model_len={4 * positions}"])
    with pytest.raises(ConfigError, match=rf"max_model_len={4 * positions} is longer than the {positions} positions"):
        check_rollout(rollout_role(cfg))
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", [*overrides, f"rollout.max_model_len={positions}"])
    check_rollout(rollout_role(cfg))
