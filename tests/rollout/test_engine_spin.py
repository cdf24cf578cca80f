"""RLX_ENGINE_NO_SPIN (set by the launcher with rollout.yield_cpu on a CPU host): a vLLM worker that imports
the weight-sync extension builds its queue readers to spin ENGINE_SPIN_S after a read, not vLLM's second,
and a reader that has gone to sleep is still woken by the next message. Checked on vLLM's own shared-memory
queue, in a child process so that the change stays out of this one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlx.rollout.priority import ENGINE_SPIN_S, ENV_NO_SPIN

pytest.importorskip("vllm")

CHILD = """
import json, threading, time
import rlx.rollout.backends.vllm  # what a vLLM worker imports first (worker_extension_cls)
from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

writer = MessageQueue(n_reader=1, n_local_reader=1)
reader = MessageQueue.create_from_handle(writer.export_handle(), 0)
ready = threading.Thread(target=writer.wait_until_ready)
ready.start(); reader.wait_until_ready(); ready.join()
received = []
def read():
    for _ in range(3):
        received.append(reader.dequeue(timeout=10))
thread = threading.Thread(target=read)
thread.start()
for i in range(3):
    time.sleep(0.3)  # longer than the shortened spin: the reader sleeps and must be woken
    writer.enqueue(i)
thread.join(30)
print(json.dumps({"busy_loop_s": reader._spin_condition.busy_loop_s, "received": received}))
del reader, writer
"""


@pytest.mark.parametrize("no_spin", [True, False])
def test_worker_queue_readers_spin_briefly_and_still_wake(no_spin):
    env = {k: v for k, v in os.environ.items() if k != ENV_NO_SPIN}
    if no_spin:
        env[ENV_NO_SPIN] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["received"] == [0, 1, 2]
    assert result["busy_loop_s"] == (ENGINE_SPIN_S if no_spin else 1)
