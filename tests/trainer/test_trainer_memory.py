"""A step too large for memory stops with one line naming the keys that make it fit, the weights untouched.

The trainer runs in a process of its own whose address space is capped (``RLIMIT_AS``) a GiB above what it holds
once built, so its update's activations cannot be allocated: the CPU allocator's real failure, which
``rlx.trainer.memory`` turns into ``TrainerOutOfMemory`` as it does CUDA's ``OutOfMemoryError``. On a GPU the
same error comes from CUDA's allocator (tests/launch/test_gpu_faults.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CODE = """
import resource, sys, torch
from pathlib import Path
from tests.trainer.test_trainer_step import build_batch, make_trainer
from rlx.trainer.tiny import build_tiny_model
from rlx.trainer.memory import TrainerOutOfMemory

trainer = make_trainer(build_tiny_model(Path(sys.argv[1])), micro_batch_tokens=1 << 20)
g = torch.Generator().manual_seed(0)
rows = 64
prompts = [torch.randint(4, 40, (500,), generator=g).tolist() for _ in range(rows)]
completions = [torch.randint(4, 40, (1500,), generator=g).tolist() for _ in range(rows)]
batch = build_batch(prompts, completions, [[-1.0] * 1500] * rows, [float(i % 2) for i in range(rows)], pad_id=0)
before = {name: t.clone() for name, t in trainer.named_tensors()}
vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]))
try:
    trainer.step(batch)
except TrainerOutOfMemory as exc:
    unchanged = all(torch.equal(t, before[name]) for name, t in trainer.named_tensors())
    print("ERROR", exc)
    print("UNCHANGED", unchanged)
    sys.exit(3)
print("the step fitted")
"""


def test_an_update_too_large_for_memory_names_the_keys_and_leaves_the_weights(tmp_path):
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", CODE, str(tmp_path / "model")],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
        check=False,
    )
    out = proc.stdout
    if proc.returncode == 0:
        pytest.fail(f"the step fitted in the capped address space: {out[-500:]}")
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-3000:]
    error = next(line for line in out.splitlines() if line.startswith("ERROR "))
    assert "the trainer ran out of memory in the update on the CPU" in error
    assert "can't allocate memory" in error  # the allocator's own words, shortened to their first line
    for key in (
        "trainer.micro_batch_tokens (now 1048576)",
        "model.gradient_checkpointing=true",
        "trainer.logprob_chunk_size",
    ):
        assert key in error, error
    assert "UNCHANGED True" in out  # no optimizer step: the weights are as before
