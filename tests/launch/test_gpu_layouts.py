"""Every layout one GPU allows, as `rlx train` runs them: the engine colocated with the trainer, asleep at level 1
or 2 while the trainer trains, the trainer offloading or staying, vLLM or the transformers (hf) backend, and a run
stopped by SIGTERM mid-run that ends every process within seconds and resumes from its checkpoint.

A tiny Qwen2 model (float32 weights) with a bfloat16 engine; every sync verified; mean |dlogp| under 0.05 (bfloat16's
rounding of this model), recorded per step with each layout's phase peaks (``record_property``) for the GPU
suite's report (`make test-gpu`, docs/results/gpu_tests.json). The architecture families run colocated in
tests/launch/test_families.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from rlx.formats.checkpoint import list_checkpoints
from tests.helpers import start_rlx, stop_group
from tests.launch.test_train import (
    assert_no_children_alive,
    child_pids,
    read_metrics,
    run_to_end,
    small_config,
    wait_for,
)

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

GPU = ("trainer.device=cuda", "model.rollout_dtype=bfloat16", "placement.mode=colocated", "rollout.enforce_eager=true")
STOP_BOUND_S = 30.0
"""The longest a SIGTERM'd run may take to end every process (the launcher's own grace is shorter)."""


def free_gpu_bytes() -> int:
    """Free memory of GPU 0, seen from a fresh process (nothing of this one's allocator in it)."""
    code = "import torch; print(torch.cuda.mem_get_info(0)[0])"
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


class GpuLeftovers:
    """Whether a run left anything holding the GPU. Alone on the GPU (a serial suite): its free memory, from a fresh
    process, is back within a GiB of what it was before the run. Beside other tests (``pytest -n``, where their runs
    hold memory too): no process that holds GPU memory (``nvidia-smi``'s compute processes) is in one of the run's
    process groups. Which check ran is recorded (``gpu_leftover_check``)."""

    def __init__(self) -> None:
        self.shared = bool(os.environ.get("PYTEST_XDIST_WORKER"))
        self.free_before = None if self.shared else free_gpu_bytes()

    def check(self, run_dir, record_property) -> None:
        if not self.shared:
            record_property("gpu_leftover_check", "free memory")
            lost = self.free_before - free_gpu_bytes()
            record_property("gpu_free_lost_gb", round(lost / 2**30, 3))
            assert lost < 2**30, f"{lost / 2**30:.2f} GiB of the GPU not given back"
            return
        record_property("gpu_leftover_check", "compute processes")
        groups = set(child_pids(run_dir).values())
        query = ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"]
        holders = [int(p) for p in subprocess.run(query, capture_output=True, text=True, check=True).stdout.split()]
        left = []
        for pid in holders:
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(pid) in groups:
                    left.append(pid)
        assert not left, f"processes of the run still hold GPU memory: {left}"


@pytest.fixture(scope="module")
def gpu_model_dir(tmp_path_factory):
    """The tiny Qwen2 model (tied head) at heads of 64, which every GPU attention kernel of vLLM takes."""
    from rlx.trainer.tiny import build_tiny_family

    return build_tiny_family(tmp_path_factory.mktemp("gpu_model") / "model", "qwen2")


def check_rows(rows: list[dict], steps: int, record_property) -> None:
    trained = [r for r in rows if "time_step" in r]
    assert [r["step"] for r in trained] == list(range(1, steps + 1))
    assert all(r["sync_verified"] == 1.0 for r in trained)
    dlogp = [r["logprob_diff_mean"] for r in trained]
    record_property("dlogp_mean", dlogp)
    record_property("step_s", [round(r["time_step"], 3) for r in trained])
    peaks = {k: max(r[k] for r in trained) for k in trained[0] if k.startswith("mem_") and k.endswith("_gb")}
    record_property("peaks_gb", peaks)
    assert max(dlogp) < 0.05, dlogp
    assert peaks["mem_peak_train_gb"] > 0 and peaks["mem_engine_peak_generate_gb"] > 0  # both on the GPU


@pytest.mark.parametrize(
    ("backend", "sleep_level", "offload"),
    [("vllm", 1, "false"), ("vllm", 2, "false"), ("vllm", 1, "true"), ("vllm", 2, "true"), ("hf", 1, "true")],
)
def test_colocated_run_on_one_gpu(gpu_model_dir, tmp_path, record_property, backend, sleep_level, offload):
    leftovers = GpuLeftovers()
    config = small_config(tmp_path, gpu_model_dir, backend, checkpoint={"every": 0})
    code, output = run_to_end(
        config,
        tmp_path,
        *GPU,
        f"placement.sleep_level={sleep_level}",
        f"placement.offload={offload}",
        "rollout.device=cuda",
        "trainer.total_steps=3",
        "trainer.eval_every=0",
        "sync.verify=true",
    )
    assert code == 0, output[-4000:]
    run_dir = tmp_path / "run"
    check_rows(read_metrics(run_dir), 3, record_property)
    assert_no_children_alive(run_dir)
    leftovers.check(run_dir, record_property)


def test_sigterm_mid_run_ends_every_process_and_resumes_on_one_gpu(gpu_model_dir, tmp_path, record_property):
    leftovers = GpuLeftovers()
    config = small_config(tmp_path, gpu_model_dir, "vllm", checkpoint={"every": 1, "keep": 2})
    run_dir = tmp_path / "run"
    log = tmp_path / "first.log"
    proc = start_rlx(["train", str(config), *GPU, "trainer.total_steps=2000", "trainer.eval_every=0"], log)

    def checkpointed_step_2() -> bool:
        return any(
            c.name.split("_")[1].isdigit() and int(c.name.split("_")[1]) >= 2 and (c / "manifest.json").exists()
            for c in list_checkpoints(run_dir / "checkpoints")
        )

    try:
        wait_for(checkpointed_step_2, 400, proc, log)
        signalled = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(STOP_BOUND_S)
        stopped_s = time.monotonic() - signalled
    finally:
        stop_group(proc)
    assert_no_children_alive(run_dir, timeout_s=STOP_BOUND_S)
    record_property("stop_s", round(stopped_s, 2))
    leftovers.check(run_dir, record_property)
    complete = [c for c in list_checkpoints(run_dir / "checkpoints") if (c / "manifest.json").exists()]
    assert complete and all((c / "manifest.json").exists() for c in list_checkpoints(run_dir / "checkpoints"))
    last = max(int(c.name.split("_")[1]) for c in complete)
    code, output = run_to_end(
        config,
        tmp_path,
        *GPU,
        f"trainer.total_steps={last + 2}",
        "trainer.eval_every=0",
        "sync.verify=true",
        "--resume",
    )
    assert code == 0, output[-4000:]
    rows = [r for r in read_metrics(run_dir) if "time_step" in r]
    assert [r["step"] for r in rows][-2:] == [last + 1, last + 2]
    assert all(r["sync_verified"] == 1.0 for r in rows[-2:])
    assert_no_children_alive(run_dir)
