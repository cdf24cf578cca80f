"""A rollout server that yields the CPU to the trainer beside it, when its launcher asks for it.

Two settings, both from ``rollout.yield_cpu`` on a CPU-only host:

- ``RLX_SCHED_IDLE=1`` (sync mode): the server runs under ``SCHED_IDLE``, so it runs only when no
  normal process wants the core: while the trainer waits for a batch the server generates at full
  speed, while the trainer computes the server gets what is left. The engine's own processes
  inherit the policy. Linux only; elsewhere a no-op.
- ``RLX_ENGINE_NO_SPIN=1`` (any mode): vLLM's worker stops busy-polling its input queue soon after
  each engine step. vLLM's worker spins for a second (``SpinCondition.busy_loop_s``, with no setting
  of its own) waiting for the next step; at idle priority that spin still slowed the trainer's update
  by about a fifth on a 2-core host (measured with the trace's update spans). The worker instead spins
  ``ENGINE_SPIN_S``, longer than the gap between two engine steps of one generation, and then sleeps
  on the queue's notify socket, as vLLM's own worker does after its second. Applied in each worker
  process when it imports the weight-sync extension, before vLLM builds the worker's queues.
"""

from __future__ import annotations

import os

ENV_SCHED_IDLE = "RLX_SCHED_IDLE"
ENV_NO_SPIN = "RLX_ENGINE_NO_SPIN"
ENGINE_SPIN_S = 0.05  # seconds a vLLM queue reader spins after a read before it sleeps (vLLM: 1 s)


def apply_from_env() -> bool:
    """Switch this process to SCHED_IDLE when ``RLX_SCHED_IDLE=1``; True when it did."""
    if os.environ.get(ENV_SCHED_IDLE) != "1" or not hasattr(os, "SCHED_IDLE"):
        return False
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    return True


def stop_engine_spin_from_env() -> bool:
    """With ``RLX_ENGINE_NO_SPIN=1``: vLLM queue readers built from now on spin ``ENGINE_SPIN_S`` after a read,
    not a second; True when set."""
    if os.environ.get(ENV_NO_SPIN) != "1":
        return False
    from vllm.distributed.device_communicators import shm_broadcast

    spinning = shm_broadcast.SpinCondition
    if getattr(spinning, "rlx_no_spin", False):
        return True

    class SpinCondition(spinning):
        rlx_no_spin = True

        def __init__(self, *args, **kwargs) -> None:
            kwargs["busy_loop_s"] = ENGINE_SPIN_S
            super().__init__(*args, **kwargs)

    shm_broadcast.SpinCondition = SpinCondition  # MessageQueue builds its readers' conditions by this name
    return True
