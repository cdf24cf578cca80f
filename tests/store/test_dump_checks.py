"""A dump whose manifest or contents do not hold together is refused by `rlx train`'s pre-flight with one
line naming the file, the field or row, and the fix, before any process starts. Each case spoils a real
dump (written by ``DumpWriter``) and, for the contents, recomputes the manifest's sha256 as a careful
editor would: the checksum alone cannot catch it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from rlx.cli import app
from rlx.config import load_config
from rlx.store.base import Sample
from rlx.store.dump import DumpWriter, file_sha256, model_vocab_size
from tests.helpers import write_config

N = 2
STEP = "step_000001.safetensors"


def samples(vocab: int) -> list[Sample]:
    rows = []
    for i in range(2 * N):
        completion = torch.tensor([(5 + i + k) % vocab for k in range(3 + i)])
        rows.append(
            Sample(
                torch.tensor([1, 2, 3 + i]), completion, -torch.rand(len(completion)), reward=float(i % 2), group=i // N
            )
        )
    return rows


@pytest.fixture(scope="module")
def dump(tiny_model_dir, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dump_checks")
    config = write_config(
        root / "writer.yaml", tiny_model_dir, rollout={"backend": "hf", "n": N, "dump_dir": str(root / "dump")}
    )
    cfg = load_config(str(config))
    writer = DumpWriter(cfg.model.path, cfg.rollout, cfg.task)
    for step in (1, 2):
        writer.write(step, samples(model_vocab_size(tiny_model_dir)), {"reward_mean": 0.5}, ["a", "b", "c", "d"])
    return root / "dump"


def replay(case: Path, model_dir: Path) -> tuple[int, str]:
    config = write_config(
        case / "run.yaml",
        model_dir,
        rollout={"backend": "hf", "n": N, "reuse": "replay", "reuse_dir": str(case / "dump")},
        trainer={"prompts_per_step": 2, "micro_batch_size": 4, "total_steps": 2, "output_dir": str(case / "run")},
    )
    result = CliRunner().invoke(app, ["train", str(config)])
    return result.exit_code, result.output


def assert_refused(case: Path, code: int, output: str, *fragments: str) -> None:
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in output, output
    for fragment in fragments:
        assert fragment in output, output
    assert not (case / "run" / "logs").exists(), "a process was started before the dump was checked"


def edit_manifest(dump: Path, edit) -> None:
    manifest = json.loads((dump / "manifest.json").read_text())
    edit(manifest)
    (dump / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda m: m.pop("model"), "manifest.json: field model is missing"),
        (lambda m: m["model"].pop("sha256"), "manifest.json: field model.sha256 is missing"),
        (
            lambda m: m.update(steps={k: v["file"] for k, v in m["steps"].items()}),
            "manifest.json: field steps.1: expected object, got str",
        ),
        (lambda m: m.update(steps=list(m["steps"].values())), "manifest.json: field steps: expected object, got array"),
        (lambda m: m["steps"]["1"].update(rows="4"), "manifest.json: field steps.1.rows: expected int, got str"),
        (lambda m: m["steps"].update(first=m["steps"].pop("1")), "manifest.json: a key of field steps: expected int"),
        (lambda m: m["sampling"].update(n=None), "manifest.json: field sampling.n: expected int, got null"),
        (
            lambda m: m["steps"]["1"].update(file="../outside.safetensors"),
            "field steps.1.file='../outside.safetensors' is not a step",
        ),
        (lambda m: m["steps"]["1"].update(rows=5), "has 4 rows, the manifest says 5"),
    ],
)
def test_a_manifest_that_is_not_one_is_refused_naming_the_field(dump, tiny_model_dir, tmp_path, edit, expected):
    shutil.copytree(dump, tmp_path / "dump")
    edit_manifest(tmp_path / "dump", edit)
    code, output = replay(tmp_path, tiny_model_dir)
    assert_refused(tmp_path, code, output, expected, "regenerate the dump")


def tensors(edit):
    def spoil(path: Path) -> None:
        t = load_file(path)
        metadata = edit(t) or {"step": "1", "metrics": "{}", "texts": "[]"}
        save_file(t, path, metadata=metadata)

    return spoil


def truncate_bytes(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-40])


def set_at(key: str, index: int, value):
    def edit(t):
        t[key][index] = value

    return edit


@pytest.mark.parametrize(
    "spoil, expected",
    [
        (truncate_bytes, f"{STEP} is not a readable safetensors file"),
        (
            tensors(lambda t: t.update(completion_ids=t["completion_ids"][:-3])),
            "tensor 'completion_ids' holds 15 values, its rows' completion_lens add up to 18",
        ),
        (tensors(set_at("prompt_lens", 2, -1)), "row 2: prompt_lens is -1"),
        (tensors(set_at("completion_lens", 1, 5)), "completion_lens add up to 19"),
        (tensors(lambda t: t.update(rewards=t["rewards"][:3])), "tensor 'rewards' has 3 rows, the manifest says 4"),
        (
            tensors(set_at("completion_ids", 8, 10**6)),
            "row 2: completion_ids holds a token id outside the model's vocab",
        ),
        (tensors(set_at("prompt_ids", 0, -4)), "row 0: prompt_ids holds a token id outside"),
        (tensors(set_at("logprobs", 17, float("nan"))), "row 3: logprobs holds a logprob that is not finite"),
        (tensors(set_at("rewards", 2, float("nan"))), "row 2: reward nan is not finite"),
        (tensors(set_at("rewards", 3, float("-inf"))), "row 3: reward -inf is not finite"),
        (tensors(set_at("status", 1, 9)), "row 1: status 9 is not one of"),
        (tensors(lambda t: t.update(logprobs=t["logprobs"].double())), "tensor 'logprobs' is torch.float64"),
        (tensors(lambda t: t.__delitem__("groups")), "lacks the tensor 'groups'"),
        (tensors(lambda t: {"step": "7", "metrics": "{}", "texts": "[]"}), "its metadata says step '7'"),
        (
            tensors(lambda t: {"step": "1", "metrics": "not json", "texts": "[]"}),
            "metadata 'metrics' is not an object of",
        ),
        (
            tensors(lambda t: {"step": "1", "metrics": "{}", "texts": "[1, 2]"}),
            "metadata 'texts' is not a list of strings",
        ),
    ],
)
def test_altered_contents_are_refused_naming_the_file_and_row(dump, tiny_model_dir, tmp_path, spoil, expected):
    shutil.copytree(dump, tmp_path / "dump")
    spoil(tmp_path / "dump" / STEP)
    edit_manifest(tmp_path / "dump", lambda m: m["steps"]["1"].update(sha256=file_sha256(tmp_path / "dump" / STEP)))
    code, output = replay(tmp_path, tiny_model_dir)
    assert_refused(tmp_path, code, output, STEP, expected, "regenerate the dump")


def test_the_unspoiled_dump_passes_the_checks(dump, tiny_model_dir, tmp_path):
    from rlx.store.dump import check_dump

    shutil.copytree(dump, tmp_path / "dump")
    config = write_config(
        tmp_path / "run.yaml",
        tiny_model_dir,
        rollout={"backend": "hf", "n": N, "reuse": "replay", "reuse_dir": str(tmp_path / "dump")},
        trainer={"prompts_per_step": 2, "micro_batch_size": 4, "total_steps": 2},
    )
    cfg = load_config(str(config))
    loaded = check_dump(cfg.model.path, cfg.rollout, cfg.trainer.total_steps)
    rows, metrics, texts = loaded.step(2)
    assert [len(r.completion_ids) for r in rows] == [3, 4, 5, 6] and metrics == {"reward_mean": 0.5}
    assert texts == ["a", "b", "c", "d"] and [r.reward for r in rows] == [0.0, 1.0, 0.0, 1.0]
