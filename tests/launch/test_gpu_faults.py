"""Faults on one GPU, as `rlx train` meets them colocated with a vLLM engine: each case states what the user sees,
how long every process takes to end, what is left, and whether `--resume` continues with nothing lost.

Every case records one row (``record_property("fault", ...)``: case, phase, message, seconds_to_end, leftovers,
resumed, ok) for `python scripts/gpu_faults_report.py REPORT OUT`, which writes docs/results/gpu_faults_h200.json
from the suite's ``--report-json``. The phases are held open by a reward function that blocks at a chosen sample
until the test lets it go (as tests/launch/test_restarts.py does), so each fault lands where it is meant to.
The tiny Qwen2 of tests/launch/test_gpu_layouts.py, a bfloat16 engine, every sync verified.

Cases: the engine cannot wake (another process takes the GPU while it sleeps); the engine core SIGKILLed between
its generation and the sync (the run restarts the server, which rejoins with verified weights); SIGTERM while the
run is in its reward phase, in its update, and while a checkpoint is written (held in a checkpoint plugin's save
hook); Ctrl-C (SIGINT) while the engine generates; the trainer out of memory in its update; a non-finite loss at
every step. Left out: a signal inside the sync (a few hundred ms of CUDA IPC here, with nothing that can hold it
open). Left for a multi-GPU machine: the same with separate trainer and engine GPUs and NCCL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlx.formats.checkpoint import list_checkpoints
from tests.helpers import start_rlx, stop_group, wait_ready
from tests.launch.test_gpu_layouts import GPU, STOP_BOUND_S, GpuLeftovers
from tests.launch.test_train import child_pids, read_metrics, run_to_end, small_config, wait_for

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

HELD_AT = 17
"""The reward call that holds the run: step 2's first sample (4 prompts x 4 samples a step)."""

REWARD = """
import os, time

calls = 0

def score(completion, answer):
    global calls
    calls += 1
    if calls == int(os.environ["HELD_AT"]):
        open(os.environ["HELD"], "w").close()
        while not os.path.exists(os.environ["GO"]):
            time.sleep(0.05)
    return float(len(completion) % 2)
"""

HELD_PLUGIN = """
import os, time


class Plugin:
    def on_save(self, ckpt_dir, step):
        if step == int(os.environ["HELD_SAVE_AT"]):
            open(os.environ["HELD"], "w").close()
            while not os.path.exists(os.environ["GO"]):
                time.sleep(0.05)
"""


def install_held_plugin(site: Path) -> None:
    """The checkpoint plugin ``held`` (``rlx.plugins`` entry point), installed in ``site`` as a dist-info."""
    (site / "rlx_held_plugin.py").write_text(HELD_PLUGIN)
    info = site / "rlx_held_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlx-held-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[rlx.plugins]\nheld = rlx_held_plugin:Plugin\n")


KV_CACHE_GIB = 8
"""The engine's KV cache in the wake probe: what the wake must find free again."""
HOG_LEAVES_GIB = 2
"""What the hog leaves free of what the sleeping engine gave back: room for the trainer's update."""

HOG = """
import sys, time, torch
leave, grow = int(sys.argv[1]), int(sys.argv[2])
base = torch.cuda.mem_get_info(0)[0]
print("watching", base, flush=True)
while torch.cuda.mem_get_info(0)[0] < base + grow:  # until the engine sleeps and gives its KV cache back
    time.sleep(0.002)
held = []
while True:  # then take all but ``leave`` of whatever is freed, the trainer's released cache too
    free = torch.cuda.mem_get_info(0)[0]
    if free > leave + (64 << 20):
        held.append(torch.empty(free - leave, dtype=torch.uint8, device="cuda"))
        print("holding", sum(h.numel() for h in held), flush=True)
    time.sleep(0.002)
"""


@pytest.fixture(scope="module")
def gpu_model_dir(tmp_path_factory):
    from rlx.trainer.tiny import build_tiny_family

    return build_tiny_family(tmp_path_factory.mktemp("gpu_model") / "model", "qwen2")


class HeldRun:
    """`rlx train` colocated on the GPU, held in its reward at ``HELD_AT`` until ``go()``."""

    def __init__(
        self,
        tmp_path: Path,
        model_dir: Path,
        *overrides: str,
        checkpoint_every: int = 1,
        held_at: int = HELD_AT,
        held_save_at: int = 0,
    ) -> None:
        """``held_at`` 0: the reward never holds (it still scores half the samples 1, so every group has a signal).
        ``held_save_at``: the checkpoint of that step holds in its write instead (a checkpoint plugin's save hook,
        which runs in the staged directory before the manifest and the rename)."""
        (tmp_path / "held_reward.py").write_text(REWARD)
        plugins = []
        if held_save_at:
            install_held_plugin(tmp_path)
            plugins = ["held"]
        self.tmp, self.run_dir, self.log = tmp_path, tmp_path / "run", tmp_path / "train.log"
        self.config = small_config(
            tmp_path,
            model_dir,
            "vllm",
            task={"reward": "held_reward:score"},
            checkpoint={"every": checkpoint_every, "keep": 3, "plugins": plugins},
            sync={"verify": True},
        )
        self.env = {
            "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
            "HELD": str(tmp_path / "held"),
            "GO": str(tmp_path / "go"),
            "HELD_AT": str(held_at),
            "HELD_SAVE_AT": str(held_save_at),
        }
        self.args = ["train", str(self.config), *GPU, "trainer.eval_every=0", *overrides]
        self.proc = start_rlx(self.args, self.log, self.env)

    def wait_held(self, timeout_s: float = 400.0) -> None:
        wait_for((self.tmp / "held").exists, timeout_s, self.proc, self.log)

    def go(self) -> None:
        (self.tmp / "go").touch()

    def wait_end(self, timeout_s: float) -> float:
        """Seconds until the launcher exits (``timeout_s`` at most; then it is stopped)."""
        start = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout_s)
        return time.monotonic() - start

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        stop_group(self.proc)

    def __enter__(self) -> HeldRun:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()  # whatever ended the test: the run's process group goes with it

    def resume(self, steps: int, *overrides: str) -> tuple[int, str]:
        """``--resume`` to ``steps`` steps, the reward no longer held (its module on the same path)."""
        (self.tmp / "go").touch()
        log = self.tmp / "resume.log"
        args = ["train", str(self.config), *GPU, f"trainer.total_steps={steps}", "trainer.eval_every=0", *overrides]
        proc = start_rlx([*args, "--resume"], log, self.env)
        try:
            proc.wait(400)
        finally:
            stop_group(proc)
        return proc.returncode, log.read_text(errors="replace")


def leftovers_after(run: HeldRun, gpu: GpuLeftovers, record_property) -> int:
    """0 when no process of the run is alive and none holds GPU memory; else how many process groups are."""
    from tests.helpers import group_alive

    deadline = time.monotonic() + STOP_BOUND_S
    pids = child_pids(run.run_dir)
    while time.monotonic() < deadline and any(group_alive(g) for g in pids.values()):
        time.sleep(0.5)
    alive = [name for name, g in pids.items() if group_alive(g)]
    return len(alive) + gpu_left(gpu, run.run_dir, record_property)


def gpu_left(gpu: GpuLeftovers, run_dir: Path, record_property) -> int:
    """1 when a process of the run still holds GPU memory (or the GPU lost memory), else 0."""
    try:
        gpu.check(run_dir, record_property)
    except AssertionError:
        return 1
    return 0


def first_error_line(output: str, *needles: str) -> str:
    for line in output.splitlines():
        if any(n in line for n in needles):
            return line.strip()
    return ""


def resumed_from_last(run: HeldRun, extra_steps: int = 2) -> str:
    """'ok: steps A..B' when --resume continued after the newest whole checkpoint with every sync verified."""
    complete = [c for c in list_checkpoints(run.run_dir / "checkpoints") if (c / "manifest.json").exists()]
    if any(not (c / "manifest.json").exists() for c in list_checkpoints(run.run_dir / "checkpoints")):
        return "a checkpoint without its manifest was left"
    last = max((int(c.name.split("_")[1]) for c in complete), default=0)
    code, output = run.resume(last + extra_steps)
    if code != 0:
        return f"failed ({code}): {output.strip().splitlines()[-1] if output.strip() else ''}"
    rows = [r for r in read_metrics(run.run_dir) if "time_step" in r]
    done = [r["step"] for r in rows][-extra_steps:]
    verified = all(r["sync_verified"] == 1.0 for r in rows[-extra_steps:])
    return (
        f"ok: steps {done[0]}..{done[-1]}"
        if done == list(range(last + 1, last + extra_steps + 1)) and verified
        else (f"steps {done}, verified {verified}")
    )


def row_message(output: str) -> str:
    return first_error_line(output, "max_nonfinite_steps")


def record(record_property, **row) -> dict:
    record_property("fault", row)
    return row


def test_an_engine_that_cannot_wake_stops_the_run_naming_memory_and_keys(gpu_model_dir, tmp_path, record_property):
    """Another process takes the GPU while the engine sleeps (the hog waits for the KV cache to be given back):
    the wake fails, the run stops within seconds with a line naming the memory and the keys. The engine's KV
    cache (8 GiB) is larger than what the hog leaves (2 GiB, for the trainer's update) and whatever the trainer
    frees just before the wake together, so the engine cannot win that memory back by waking first."""
    gpu = GpuLeftovers()
    run = HeldRun(
        tmp_path,
        gpu_model_dir,
        "trainer.total_steps=4",
        "trainer.epochs_per_step=20",
        "placement.offload=false",
        f"rollout.kv_cache_gb={KV_CACHE_GIB}",
    )
    hog = None
    try:
        run.wait_held()
        hog_log = open(tmp_path / "hog.log", "w")  # noqa: SIM115 - closed below
        hog = subprocess.Popen(
            [sys.executable, "-c", HOG, str(HOG_LEAVES_GIB << 30), str(KV_CACHE_GIB // 2 << 30)],
            stdout=hog_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        # the hog measures the free memory with the engine awake before the run goes on (its torch import and CUDA
        # context take seconds on a GPU host: a fixed wait let it measure with the engine asleep, then wait forever)
        wait_for(lambda: "watching" in (tmp_path / "hog.log").read_text(), 120, hog, tmp_path / "hog.log")
        run.go()
        seconds = run.wait_end(300)
    finally:
        run.stop()
        if hog is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(hog.pid, signal.SIGKILL)
            hog.wait(10)
            hog_log.close()
    output = run.output()
    message = first_error_line(output, "could not wake", "out of memory", "Error")
    left = leftovers_after(run, gpu, record_property)
    resumed = resumed_from_last(run)
    row = record(
        record_property,
        case="engine_cannot_wake",
        phase="wake after the update (another process took the GPU while the engine slept)",
        message=message,
        seconds_to_end=round(seconds, 2),
        leftovers=left,
        resumed=resumed,
        hog=(tmp_path / "hog.log").read_text()[-300:],
        ok=run.proc.returncode not in (0, None)
        and "could not wake" in message
        and "rollout.kv_cache_gb" in message
        and left == 0
        and resumed.startswith("ok"),
    )
    assert row["ok"], (row, output[-3000:])


def test_an_engine_core_killed_between_generation_and_sync_is_restarted_and_rejoins_verified(
    gpu_model_dir, tmp_path, record_property
):
    from tests.rollout.test_engine_ends import engine_core_pid

    gpu = GpuLeftovers()
    run = HeldRun(tmp_path, gpu_model_dir, "trainer.total_steps=4", "rollout.restart_on_failure=true")
    try:
        run.wait_held()
        server = child_pids(run.run_dir)["rollout0"]
        os.kill(engine_core_pid(server), signal.SIGKILL)
        wait_for(lambda: child_pids(run.run_dir)["rollout0"] != server, 120, run.proc, run.log)  # restarted
        wait_ready(f"ipc://{run.run_dir / 'rollout-0.sock'}", run.proc, run.log)  # it rejoins at the next sync
        run.go()
        seconds = run.wait_end(400)
    finally:
        run.stop()
    output = run.output()
    rows = [r for r in read_metrics(run.run_dir) if "time_step" in r]
    left = leftovers_after(run, gpu, record_property)
    row = record(
        record_property,
        case="engine_core_killed",
        phase="between generation and the sync (SIGKILL to vLLM's engine core)",
        message=first_error_line(output, "restart", "died", "Error"),
        seconds_to_end=round(seconds, 2),
        leftovers=left,
        resumed="the run itself finished" if run.proc.returncode == 0 else f"exit {run.proc.returncode}",
        steps=[r["step"] for r in rows],
        ok=run.proc.returncode == 0
        and [r["step"] for r in rows] == [1, 2, 3, 4]
        and all(r["sync_verified"] == 1.0 for r in rows)
        and left == 0,
    )
    assert row["ok"], (row, output[-3000:])


def test_sigterm_in_the_reward_phase_ends_every_process_and_resumes(gpu_model_dir, tmp_path, record_property):
    gpu = GpuLeftovers()
    with HeldRun(tmp_path, gpu_model_dir, "trainer.total_steps=200") as run:
        run.wait_held()
        phase = "reward (the engine awake, a step's samples being scored)"
        signal_and_resume(run, signal.SIGTERM, "sigterm", phase, gpu, record_property)


STEP_2_LAST_SAMPLE = 32
"""The reward call of step 2's last sample: once it returns the step goes on to its logprob and update."""


def signal_and_resume(
    run: HeldRun, sig: int, case: str, phase: str, gpu: GpuLeftovers, record_property, then=None, **extra
) -> None:
    """Send ``sig`` to the run (in ``phase``), ``then()`` if given, and record and check its row: the launcher's exit
    code, how long it took to exit, what is left, and the resume from its newest whole checkpoint."""
    os.kill(run.proc.pid, sig)
    if then is not None:
        then()
    try:
        seconds = run.wait_end(STOP_BOUND_S)
    finally:
        run.stop()
    output = run.output()
    left = leftovers_after(run, gpu, record_property)
    whole = [c.name for c in list_checkpoints(run.run_dir / "checkpoints") if (c / "manifest.json").exists()]
    resumed = resumed_from_last(run)
    code = 130 if sig == signal.SIGINT else 128 + sig
    row = record(
        record_property,
        case=case,
        phase=phase,
        message=first_error_line(
            output, "interrupted" if sig == signal.SIGINT else f"received {signal.Signals(sig).name}"
        ),
        seconds_to_end=round(seconds, 2),
        leftovers=left,
        resumed=resumed,
        exit_code=run.proc.returncode,
        checkpoints=whole,
        ok=run.proc.returncode == code and seconds < STOP_BOUND_S and left == 0 and resumed.startswith("ok"),
        **extra,
    )
    assert row["ok"], (row, output[-3000:])


def test_sigint_in_the_generation_phase_ends_every_process_and_resumes(gpu_model_dir, tmp_path, record_property):
    """Ctrl-C while the engine generates: step 2's generation of completions up to 960 tokens (the random model
    rarely samples its end token), signalled 0.3 s after step 1's metrics are written."""
    gpu = GpuLeftovers()
    overrides = ("trainer.total_steps=200", "rollout.max_tokens=960", "rollout.max_model_len=1024")
    with HeldRun(tmp_path, gpu_model_dir, *overrides, held_at=0) as run:
        metrics = run.run_dir / "metrics.jsonl"
        wait_for(lambda: metrics.exists() and '"step": 1' in metrics.read_text(), 400, run.proc, run.log)
        time.sleep(0.3)
        phase = "generation (step 2's completions being sampled)"
        signal_and_resume(run, signal.SIGINT, "sigint", phase, gpu, record_property)


def test_sigterm_in_the_update_ends_every_process_and_resumes(gpu_model_dir, tmp_path, record_property):
    """SIGTERM 1.5 s after step 2's last reward returned: the engine asleep, the trainer in its logprob and update
    (200 epochs over the step's samples, several seconds on the tiny model)."""
    gpu = GpuLeftovers()
    overrides = ("trainer.total_steps=200", "trainer.epochs_per_step=200")
    with HeldRun(tmp_path, gpu_model_dir, *overrides, held_at=STEP_2_LAST_SAMPLE) as run:
        run.wait_held()
        run.go()
        time.sleep(1.5)
        phase = "update (the engine asleep, the trainer's epochs)"
        signal_and_resume(run, signal.SIGTERM, "sigterm", phase, gpu, record_property)


def test_sigterm_while_a_checkpoint_is_written_leaves_it_whole_or_absent(gpu_model_dir, tmp_path, record_property):
    """SIGTERM while step 2's checkpoint is being written (held in a plugin's save hook, in the staged directory
    before its manifest), the write let go 2 s later: the run stops after it, and the checkpoint is whole or absent
    (``resumed_from_last`` fails on one without its manifest)."""
    gpu = GpuLeftovers()
    with HeldRun(tmp_path, gpu_model_dir, "trainer.total_steps=200", held_at=0, held_save_at=2) as run:
        run.wait_held()

        def let_the_write_go() -> None:
            time.sleep(2.0)
            run.go()

        phase = "checkpoint write (step 2's, held 2 s in a plugin's save hook)"
        signal_and_resume(run, signal.SIGTERM, "sigterm", phase, gpu, record_property, then=let_the_write_go)


def test_a_trainer_out_of_gpu_memory_names_the_keys_and_every_process_ends(gpu_model_dir, tmp_path, record_property):
    """The trainer held to 0.3 GB of the GPU (placement.gpu_memory_gb, torch's per-process fraction) with one
    micro-batch of every sample: its update cannot allocate."""
    gpu = GpuLeftovers()
    start = time.monotonic()
    run = HeldRun(  # the held run's reward, never holding: the task's own gives the random model 0, and a step
        tmp_path,  # whose groups have no signal leaves the update nothing to allocate for
        gpu_model_dir,
        "trainer.total_steps=2",
        "placement.gpu_memory_gb=0.3",
        "trainer.prompts_per_step=64",
        "rollout.max_tokens=256",
        "trainer.micro_batch_tokens=1000000",
        checkpoint_every=0,
        held_at=0,
    )
    try:
        run.wait_end(400)
    finally:
        run.stop()
    seconds = time.monotonic() - start
    code, output, run_dir = run.proc.returncode, run.output(), run.run_dir
    message = first_error_line(output, "ran out of memory", "OutOfMemory", "Error")
    left = gpu_left(gpu, run_dir, record_property)
    row = record(
        record_property,
        case="trainer_oom",
        phase="update (a micro-batch too large for the trainer's share of the GPU)",
        message=message,
        seconds_to_end=round(seconds, 2),
        leftovers=left,
        resumed="not tried: the config itself does not fit",
        ok=code not in (0, None)
        and "trainer.micro_batch_tokens" in message
        and "model.gradient_checkpointing" in message
        and left == 0,
    )
    assert row["ok"], (row, output[-3000:])


def test_a_non_finite_loss_is_skipped_counted_and_stops_the_run_with_finite_checkpoints(
    gpu_model_dir, tmp_path, record_property
):
    """An entropy bonus of 1e38 makes every loss -inf in float32: each step is skipped (no update), counted, and
    the run stops after trainer.max_nonfinite_steps; every checkpoint written holds finite tensors only."""
    import torch
    from safetensors.torch import load_file

    gpu = GpuLeftovers()
    config = small_config(tmp_path, gpu_model_dir, "vllm", checkpoint={"every": 1, "keep": 3})
    start = time.monotonic()
    code, output = run_to_end(
        config,
        tmp_path,
        *GPU,
        "trainer.total_steps=6",
        "trainer.eval_every=0",
        "trainer.max_nonfinite_steps=2",
        "algorithm.entropy_coef=1e38",
        timeout_s=400,
    )
    seconds = time.monotonic() - start
    run_dir = tmp_path / "run"
    rows = [r for r in read_metrics(run_dir) if "time_step" in r] if (run_dir / "metrics.jsonl").exists() else []
    nonfinite = []
    for ckpt in list_checkpoints(run_dir / "checkpoints"):
        for file in ckpt.rglob("*.safetensors"):
            for name, tensor in load_file(file).items():
                if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                    nonfinite.append(f"{file.relative_to(run_dir)}:{name}")
    left = gpu_left(gpu, run_dir, record_property)
    row = record(
        record_property,
        case="nonfinite_loss",
        phase="update (every loss -inf)",
        message=first_error_line(output, "max_nonfinite_steps", "NonFinite", "Error"),
        seconds_to_end=round(seconds, 2),
        leftovers=left,
        resumed="not tried: the run stopped on purpose",
        skipped=[r.get("skipped_nonfinite") for r in rows],
        nonfinite_tensors=nonfinite[:5],
        ok=code not in (0, None)
        and "trainer.max_nonfinite_steps=2" in row_message(output)
        and rows
        and all(r.get("skipped_nonfinite") == 1.0 for r in rows)  # the stopping step is not logged
        and not nonfinite
        and left == 0,
    )
    assert row["ok"], (row, output[-3000:])
