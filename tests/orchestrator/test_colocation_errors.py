"""A colocated engine that cannot wake stops the run with one line: what failed to wake, the engine's own error,
and, when it ran out of memory, the keys that leave it room (with offload named only where it is off)."""

from __future__ import annotations

import torch

from rlx.orchestrator.colocation import wake_failure

OOM = "RolloutServerError: server 0: CUDA Error: out of memory at cumem_allocator.cpp:163\nmore lines"


def test_an_engine_out_of_memory_at_wake_names_the_keys():
    line = wake_failure(["kv_cache"], OOM, torch.device("cpu"), offloading=False)
    assert line.startswith("the rollout engine could not wake its KV cache: RolloutServerError: server 0: CUDA Error")
    assert "more lines" not in line and "\n" not in line
    assert "placement.offload=true" in line and "rollout.kv_cache_gb" in line


def test_offload_is_not_suggested_where_it_is_on_and_other_failures_name_no_keys():
    line = wake_failure(["weights"], OOM, torch.device("cpu"), offloading=True)
    assert "placement.offload" not in line and "rollout.kv_cache_gb" in line
    other = wake_failure(["weights"], "RolloutServerError: server 0: the vLLM engine died", torch.device("cpu"), False)
    assert other == "the rollout engine could not wake its weights: RolloutServerError: server 0: the vLLM engine died"


def test_the_memory_the_engine_held_awake_is_named_where_a_generation_measured_it():
    line = wake_failure(["kv_cache"], OOM, torch.device("cpu"), offloading=False, engine_gb=61.25)
    assert "; the engine held 61.25 GiB awake in its last generation" in line
    assert line.index("61.25 GiB") < line.index("To leave the engine room")
    assert "held" not in wake_failure(["kv_cache"], OOM, torch.device("cpu"), offloading=False)  # none measured
