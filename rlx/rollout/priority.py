"""A rollout server that yields the CPU: idle scheduling priority when its launcher asks for it.

The launcher sets ``RLX_SCHED_IDLE=1`` for servers that share a CPU-only host with the trainer in
sync mode (``rollout.yield_cpu``). Under ``SCHED_IDLE`` a process runs only when no normal process
wants the core: while the trainer waits for a batch the server generates at full speed, and while
the trainer computes, the engine's idle spin (vLLM's CPU worker polls for about a second after each
step) gets nothing. The engine's own processes inherit the policy. Linux only; elsewhere a no-op.
"""

from __future__ import annotations

import os

ENV_SCHED_IDLE = "RLX_SCHED_IDLE"


def apply_from_env() -> bool:
    """Switch this process to SCHED_IDLE when ``RLX_SCHED_IDLE=1``; True when it did."""
    if os.environ.get(ENV_SCHED_IDLE) != "1" or not hasattr(os, "SCHED_IDLE"):
        return False
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    return True
