"""Bad config input through the real CLI: one `error:` line naming the key and the fix, exit 2."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rlx.cli import app

runner = CliRunner()


def check(tmp_path, text: str | bytes, *overrides: str) -> tuple[int, str]:
    path = tmp_path / "run.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    result = runner.invoke(app, ["config", "check", str(path), *overrides])
    return result.exit_code, result.output


def assert_one_error_line(code: int, output: str, *fragments: str) -> None:
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert "Traceback" not in output
    for fragment in fragments:
        assert fragment in output, output


@pytest.mark.parametrize(
    "text, overrides, key",
    [
        ("model:\n  path: /m\n", ["trainer.lr=nan"], "trainer.lr"),
        ("model:\n  path: /m\n", ["rollout.temperature=inf"], "rollout.temperature"),
        ("model:\n  path: /m\n", ["algorithm.clip_low=-inf"], "algorithm.clip_low"),
        ("model:\n  path: /m\nalgorithm:\n  dual_clip: .nan\n", [], "algorithm.dual_clip"),  # no range check of its own
        ("model:\n  path: /m\n", ["trainer.weight_decay=nan"], "trainer.weight_decay"),
        ("model:\n  path: /m\n", ["trainer.betas=[0.9,inf]"], "trainer.betas"),
    ],
)
def test_non_finite_numbers_are_refused_in_every_float_field(tmp_path, text, overrides, key):
    code, output = check(tmp_path, text, *overrides)
    assert_one_error_line(code, output, key, "not a finite number", f"set {key} to a real value")


@pytest.mark.parametrize(
    "text, overrides, expected",
    [
        ("model:\n  path: /m\n", ["trainer.lr=abc"], "trainer.lr='abc' is not a number"),
        ("model:\n  path: /m\n", ["trainer.total_steps=1.5"], "trainer.total_steps=1.5 is not a whole number"),
        ("model:\n  path: /m\ntrainer:\n  lr: abc\n", [], "trainer.lr='abc' is not a number"),
        ("model:\n  path: /m\ntrainer:\n  total_steps: 1.5\n", [], "trainer.total_steps=1.5 is not a whole number"),
        ("model:\n  path: /m\nlogging:\n  console: maybe\n", [], "logging.console='maybe' is not true or false"),
        ("model:\n  path: /m\ntrainer:\n  betas: 0.9\n", [], "trainer.betas=0.9 is not a list of numbers"),
    ],
)
def test_wrong_type_names_key_type_and_value_in_one_line(tmp_path, text, overrides, expected):
    code, output = check(tmp_path, text, *overrides)
    key = expected.split("=")[0]
    assert_one_error_line(code, output, expected, f"set {key} to")


def test_unreadable_files_and_defaults_are_one_line(tmp_path):
    code, output = check(tmp_path, b"model:\n  path: /m\xff\xfe\n")
    assert_one_error_line(code, output, "is not UTF-8 text", "line 2", "save the config as UTF-8")
    code, output = check(tmp_path, "defaults: 5\nmodel:\n  path: /m\n")
    assert_one_error_line(code, output, "defaults in", "must be a list")
    code, output = check(tmp_path, "defaults:\n  - no_such_group\nmodel:\n  path: /m\n")
    assert_one_error_line(code, output, "no_such_group", "beside run.yaml")
    for path, what in (("/dev/null", "is not a regular file"), (str(tmp_path), "is a directory")):
        result = runner.invoke(app, ["config", "check", path])
        assert_one_error_line(result.exit_code, result.output, path, what)


def test_duplicate_keys_and_huge_files_are_refused_in_one_line(tmp_path):
    code, output = check(tmp_path, "model:\n  path: /a\ntrainer:\n  lr: 1e-4\n  lr: 1e-2\n")
    assert_one_error_line(code, output, "'lr' appears twice", "run.yaml:5")
    code, output = check(tmp_path, "base: &b {path: /m}\nmodel:\n  <<: *b\n")  # merge keys still merge
    assert "appears twice" not in output
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(64 << 30)  # sparse: no disk used
    result = runner.invoke(app, ["config", "check", str(big)])
    assert_one_error_line(result.exit_code, result.output, "65536 MiB, not a run config")


@pytest.mark.parametrize(
    "override, expected",
    [
        ("trainer.betas=[0.9,1.5]", "must be two values in [0, 1)"),  # AdamW would refuse it after start-up
        ("trainer.weight_decay=-0.1", "must be >= 0.0"),
        ("rollout.top_k=-5", "-1 turns top-k sampling off"),  # the engine would refuse every request
        ("task.max_operand=100000", "must be in [1, 1000]"),  # tiny_math would build 3e10 problems
    ],
)
def test_values_that_would_fail_only_after_start_up_are_refused_here(tmp_path, override, expected):
    code, output = check(tmp_path, "model:\n  path: /m\n", override)
    assert_one_error_line(code, output, override.split("=")[0], expected)


def test_a_setting_the_chosen_launcher_would_ignore_is_refused(tmp_path):
    code, output = check(tmp_path, "model:\n  path: /m\n", "launcher=ray", "rollout.restart_on_failure=true")
    assert_one_error_line(
        code, output, "rollout.restart_on_failure", "launcher=ray", "set rollout.restart_on_failure=false"
    )


@pytest.mark.parametrize("address", ["::not-an-address::", "localhost", "10.0.0.5:0", "ray://head", "http://head:8265"])
def test_a_ray_address_in_no_form_ray_takes_is_refused_naming_the_forms(tmp_path, address):
    code, output = check(tmp_path, "model:\n  path: /m\n", "launcher=ray", f"ray.address='{address}'")
    assert_one_error_line(
        code, output, f"ray.address={address!r} is not a Ray address", "HOST:PORT", "ray://HOST:PORT", "auto"
    )


@pytest.mark.parametrize(
    "address", ["auto", "local", "10.0.0.5:6379", "head-node.example:6379", "ray://head:10001", "[::1]:6379"]
)
def test_the_ray_address_forms_ray_takes_are_accepted(tmp_path, address):
    code, output = check(tmp_path, "model:\n  path: /m\n", "launcher=ray", f"ray.address='{address}'")
    assert code == 0, output


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["rollout.max_tokens=600", "rollout.max_model_len=512"],
            [
                "rollout.max_tokens=600 with rollout.max_model_len=512",
                "no prompt would fit",
                "set rollout.max_tokens below rollout.max_model_len",
            ],
        ),
        (["rollout.max_tokens=512"], ["rollout.max_tokens=512 with rollout.max_model_len=512"]),
        (
            ["filters.overlong=soft", "filters.overlong_buffer=40", "rollout.max_tokens=32"],
            [
                "filters.overlong_buffer=40 is longer than rollout.max_tokens=32",
                "set filters.overlong_buffer to at most",
            ],
        ),
        (
            ["trainer.num_ranks=2", "trainer.prompts_per_step=64", "rollout.n=8", "store.max_rows=100"],
            ["store.max_rows=100 is smaller than one step's batch", "= 512 samples", "set store.max_rows >= 512"],
        ),
    ],
)
def test_sizes_that_contradict_each_other_across_fields_are_refused(tmp_path, overrides, expected):
    code, output = check(tmp_path, "model:\n  path: /m\n", *overrides)
    assert_one_error_line(code, output, *expected)


@pytest.mark.parametrize("value", ["1e-40", "0.001", "5e-324"])
def test_a_temperature_too_small_to_divide_by_is_refused(tmp_path, value):
    code, output = check(tmp_path, "model:\n  path: /m\n", f"rollout.temperature={value}")
    assert_one_error_line(
        code,
        output,
        f"rollout.temperature={float(value)!r} is below 0.01",
        "set rollout.temperature=0 for greedy decoding or a value >= 0.01",
    )


def test_greedy_and_the_smallest_safe_temperature_pass(tmp_path):
    for value in ("0", "0.01"):
        code, output = check(tmp_path, "model:\n  path: /m\n", f"rollout.temperature={value}")
        assert code == 0, output


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0.001", "trainer.eval_temperature=0.001 is below 0.01; set 0 for greedy evaluation or a value >= 0.01"),
        ("-1", "trainer.eval_temperature=-1.0 must be >= 0.0"),
    ],
)
def test_an_evaluation_temperature_below_the_safe_one_is_refused(tmp_path, value, expected):
    code, output = check(tmp_path, "model:\n  path: /m\n", f"trainer.eval_temperature={value}")
    assert_one_error_line(code, output, expected)
    code, output = check(tmp_path, "model:\n  path: /m\n", "trainer.eval_temperature=0.7")
    assert code == 0, output


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["rollout.backend=hf", "rollout.engine_weights=first_sync"],
            ["rollout.engine_weights=first_sync needs rollout.backend=vllm", "set rollout.engine_weights=model"],
        ),
        (
            [
                "rollout.backend=vllm",
                "rollout.engine_weights=first_sync",
                "model.lora.rank=8",
                "model.lora.sync=adapter",
            ],
            ["the engine would keep its placeholder base weights", "model.lora.sync=merged"],
        ),
        (["rollout.engine_weights=checkpoint"], ["rollout.engine_weights", "first_sync"]),
    ],
)
def test_placeholder_engine_weights_only_where_the_first_sync_loads_them_all(tmp_path, overrides, expected):
    code, output = check(tmp_path, "model:\n  path: /m\n", *overrides)
    assert_one_error_line(code, output, *expected)
