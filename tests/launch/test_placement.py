"""Placement: which GPUs each child gets and every layout error, as a pure function (no processes)."""

from __future__ import annotations

import pytest

from rlx import placement
from rlx.config import load_config
from rlx.config.errors import ConfigError
from rlx.config.roles import rollout_role, trainer_role
from tests.helpers import write_config


def cfg(tmp_path, *overrides: str):
    """A run config with the engine's memory left to placement (the tests' configs otherwise set a small one)."""
    path = write_config(
        tmp_path / "run.yaml", tmp_path / "model", rollout={"gpu_memory_utilization": None, "kv_cache_gb": None}
    )
    return load_config(str(path), list(overrides))


# the layout functions take the roles' views of the run, cut as the launcher cuts them
def check(c, *args):
    placement.check(rollout_role(c), c.trainer, *args)


def plan(c, *args):
    return placement.plan(rollout_role(c), c.trainer, *args)


def kv_cache_bytes(c, model_config):
    return placement.kv_cache_bytes(rollout_role(c), model_config)


def resolve_offload(c, gpu_bytes):
    return placement.resolve_offload(trainer_role(c), rollout_role(c), gpu_bytes)


def served_fraction(slot, c):
    """The engine memory fraction the server in ``slot`` is started with."""
    return slot.serving(rollout_role(c)).rollout.gpu_memory_utilization


def test_cpu_host_assigns_nothing_and_keeps_the_engine_setting(tmp_path):
    c = cfg(tmp_path)
    check(c, 0)
    p = plan(c, 0)
    assert [s.name for s in (*p.trainer, *p.rollout)] == ["trainer0", "rollout0"]
    assert all(s.env("0,1") == {} and s.serving(rollout_role(c)) == rollout_role(c) for s in (*p.trainer, *p.rollout))
    assert placement.engine_memory_fraction(rollout_role(c), cpu_platform=True) == placement.CPU_FRACTION
    # trainer.device=cpu on a GPU host: the same no-op
    assert plan(cfg(tmp_path, "trainer.device=cpu"), 8).rollout[0].devices == ()


def peers(a: int, b: int) -> bool:
    return True  # every GPU reaches every other (NVLink)


def no_peers(a: int, b: int) -> bool:
    return False  # GPUs that cannot open each other's memory


def test_separate_gives_each_role_its_own_gpus(tmp_path):
    c = cfg(tmp_path, "trainer.num_ranks=2", "rollout.num_servers=2", "rollout.tensor_parallel_size=2")
    check(c, 6, peers)
    p = plan(c, 6, peers)
    assert [s.devices for s in p.trainer] == [(0,), (1,)]
    assert [s.devices for s in p.rollout] == [(2, 3), (4, 5)]
    # sync.transport=auto: CUDA IPC peer-to-peer, each engine sees the sending rank's GPU after its own
    assert p.sync_transport == "cuda_ipc" and p.rollout[1].peer_devices == (0,)
    assert p.rollout[1].env(None) == {"CUDA_VISIBLE_DEVICES": "4,5,0"}
    assert p.rollout[1].env("3,5,6,7,8,9") == {"CUDA_VISIBLE_DEVICES": "8,9,3"}  # through the launcher's own list
    assert served_fraction(p.rollout[0], c) == placement.SEPARATE_FRACTION
    assert "rollout1: GPU 4,5" in p.describe()


def test_auto_transport_falls_back_to_nccl_where_gpus_are_not_peers_and_keeps_a_named_one(tmp_path):
    c = cfg(tmp_path, "rollout.backend=vllm")
    p = plan(c, 2, no_peers)
    assert p.sync_transport == "nccl" and p.rollout[0].env(None) == {"CUDA_VISIBLE_DEVICES": "1"}
    assert "weights over NCCL" in p.describe()
    assert plan(cfg(tmp_path, "sync.transport=nccl"), 2, peers).sync_transport == "nccl"
    with pytest.raises(ConfigError, match="set sync.transport=auto"):
        check(cfg(tmp_path, "sync.transport=cuda_ipc"), 2, no_peers)
    assert plan(c, 0).sync_transport == "auto"  # no GPU: the trainer's choice (shm)
    assert plan(cfg(tmp_path, "sync.transport=gloo"), 0).sync_transport == "gloo"  # a named one stays


def test_colocated_engines_away_from_the_senders_gpu_see_it(tmp_path):
    """Two ranks on two GPUs, one engine on each: the engine on GPU 1 opens rank 0's buffer peer-to-peer."""
    c = cfg(
        tmp_path,
        "placement.mode=colocated",
        "trainer.num_ranks=2",
        "rollout.num_servers=2",
        "placement.offload=false",
        "rollout.backend=vllm",
    )
    p = plan(c, 2, peers)
    assert [s.devices for s in p.rollout] == [(0,), (1,)]
    assert [s.env(None)["CUDA_VISIBLE_DEVICES"] for s in p.rollout] == ["0", "1,0"]
    with pytest.raises(ConfigError, match="one sync uses one transport"):
        plan(c, 2, no_peers)


def test_colocated_shares_the_trainers_gpus_and_the_memory_follows_the_turns(tmp_path):
    base = ("placement.mode=colocated", "trainer.num_ranks=1", "rollout.num_servers=2")
    c = cfg(tmp_path, *base, "placement.offload=true")
    check(c, 1)
    p = plan(c, 1)
    assert [s.devices for s in p.rollout] == [(0,), (0,)]
    assert [s.memory_fraction for s in p.rollout] == [placement.TURN_FRACTION / 2] * 2
    kept = plan(cfg(tmp_path, *base, "placement.offload=false"), 1)
    assert kept.rollout[0].memory_fraction == placement.SHARED_FRACTION / 2  # the trainer keeps its state there
    two = plan(
        cfg(
            tmp_path,
            "placement.mode=colocated",
            "trainer.num_ranks=2",
            "placement.offload=false",
            "rollout.backend=vllm",
            "rollout.tensor_parallel_size=2",
        ),
        2,
    )
    assert two.rollout[0].devices == (0, 1) and two.rollout[0].memory_fraction == placement.SHARED_FRACTION


def test_a_set_engine_memory_fraction_is_what_the_launched_engines_get(tmp_path):
    """rollout.gpu_memory_utilization set by the user wins over the layout's share, colocated or separate."""
    for mode in ("colocated", "separate"):
        c = cfg(tmp_path, f"placement.mode={mode}", "rollout.gpu_memory_utilization=0.15")
        p = plan(c, 2, peers)
        assert served_fraction(p.rollout[0], c) == 0.15


@pytest.mark.parametrize(
    "overrides, gpus, fix",
    [
        (("trainer.num_ranks=2", "rollout.num_servers=2"), 3, "needs 4 GPUs"),
        (("rollout.tensor_parallel_size=2", "placement.rollout_gpus=3"), 8, "does not divide placement.rollout_gpus=3"),
        (("rollout.tensor_parallel_size=2", "placement.rollout_gpus=4"), 8, "set rollout.num_servers=2"),
        (("trainer.device=cuda",), 0, "sees no GPU"),
        (
            ("placement.mode=colocated", "rollout.num_servers=2", "placement.sleep_level=0"),
            1,
            "placement.sleep_level=1",
        ),
        (
            (
                "placement.mode=colocated",
                "trainer.num_ranks=3",
                "placement.offload=false",
                "rollout.num_servers=2",
                "rollout.tensor_parallel_size=2",
            ),
            4,
            "does not divide the 3 colocated GPUs",
        ),
        (("placement.mode=colocated", "rollout.tensor_parallel_size=2"), 4, "spans more GPUs than the 1"),
        (
            ("placement.mode=colocated", "trainer.num_ranks=2", "placement.offload=false"),
            1,
            "set trainer.num_ranks <= 1",
        ),
    ],
)
def test_layout_errors_name_the_fix(tmp_path, overrides, gpus, fix):
    c = cfg(tmp_path, "rollout.backend=vllm", *overrides)
    with pytest.raises(ConfigError, match=fix):
        check(c, gpus, peers)


@pytest.mark.parametrize(
    "overrides, fix",
    [
        (("placement.mode=colocated", "trainer.mode=one_step_off"), "set trainer.mode=sync"),
        (
            ("placement.mode=colocated", "rollout.servers=[tcp://10.0.0.1:5555]", "rollout.auth_token=x"),
            "empty rollout.servers",
        ),
        (("placement.mode=colocated", "trainer.num_ranks=2", "placement.offload=true"), "placement.offload=false"),
        (
            ("placement.mode=colocated", "placement.sleep_level=2", "model.lora.rank=8", "model.lora.sync=adapter"),
            "set placement.sleep_level=1 or model.lora.sync=merged",
        ),
        (("rollout.backend=hf", "rollout.tensor_parallel_size=2"), "needs rollout.backend=vllm"),
        (("placement.mode=stacked",), "placement.mode"),
        (("placement.sleep_level=3",), "placement.sleep_level"),
    ],
)
def test_config_errors_whatever_the_host(tmp_path, overrides, fix):
    with pytest.raises(ConfigError, match=fix):
        cfg(tmp_path, *overrides)


SMOLLM2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}


def test_colocated_kv_cache_holds_a_step_and_a_set_size_wins(tmp_path):
    """Colocated, the engine's KV cache is sized to the step it generates (what its sleep and wake move), not to
    the GPU: 64 prompts x 8 samples x 512 tokens x (2 x 30 layers x 3 KV heads x 64 x 2 bytes), a quarter over."""
    base = ("placement.mode=colocated", "trainer.prompts_per_step=64", "rollout.n=8", "rollout.max_model_len=512")
    base += ("model.rollout_dtype=bfloat16",)
    step = 64 * 8 * 512 * (2 * 30 * 3 * 64 * 2)
    assert kv_cache_bytes(cfg(tmp_path, *base), SMOLLM2) == int(placement.KV_MARGIN * step)
    two = cfg(tmp_path, *base, "rollout.num_servers=2", "rollout.tensor_parallel_size=1")
    assert kv_cache_bytes(two, SMOLLM2) == int(placement.KV_MARGIN * step / 2)  # each engine half the step
    capped = cfg(tmp_path, *base, "rollout.max_num_seqs=128")
    assert kv_cache_bytes(capped, SMOLLM2) == int(placement.KV_MARGIN * step / 4)
    assert kv_cache_bytes(cfg(tmp_path, *base, "rollout.kv_cache_gb=1.5"), SMOLLM2) == int(1.5 * 2**30)
    assert kv_cache_bytes(cfg(tmp_path, "placement.mode=separate"), SMOLLM2) is None  # the fraction's
    assert kv_cache_bytes(cfg(tmp_path, *base), {"model_type": "unknown"}) is None
    with pytest.raises(ConfigError, match="rollout.kv_cache_gb=0.0 holds no token"):
        cfg(tmp_path, "rollout.kv_cache_gb=0")


def test_unset_offload_keeps_a_trainer_that_fits_beside_the_engine_on_the_gpu(tmp_path):
    """placement.offload unset: the trainer offloads only where its state (weights, gradients, AdamW's moments in
    model.dtype) and the awake engine (weights, KV cache, room) exceed half the GPU; read from the model's files."""
    import json

    import torch
    from safetensors.torch import save_file

    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    save_file({"embed": torch.zeros(1000, 100), "head": torch.zeros(1000, 100)}, str(model / "model.safetensors"))
    (model / "config.json").write_text(json.dumps(dict(SMOLLM2, model_type="llama")))
    base = ("placement.mode=colocated", "model.dtype=float32", "trainer.prompts_per_step=4", "rollout.n=2")
    c = cfg(tmp_path, *base, "rollout.max_model_len=64")
    assert placement.count_parameters(str(model)) == 200_000
    assert placement.trainer_state_bytes(trainer_role(c), 200_000) == 200_000 * 4 * 4
    kv = kv_cache_bytes(c, SMOLLM2)
    need = 200_000 * 4 * 4 + 200_000 * 4 + kv + placement.ENGINE_ROOM_BYTES  # the engine in float32 too
    stays, why = resolve_offload(c, 2 * need)
    assert not stays and "stays on the GPU" in why
    moves, why = resolve_offload(c, 2 * need - 1)
    assert moves and "offloads" in why
    # a reference model (KL) counts once more; LoRA trains only the adapter (weights alone)
    assert placement.trainer_state_bytes(trainer_role(cfg(tmp_path, *base, "algorithm.kl_coef=0.1")), 10) == 10 * 4 * 5
    assert placement.trainer_state_bytes(trainer_role(cfg(tmp_path, *base, "model.lora.rank=8")), 10) == 10 * 4
    # as set; separate, several ranks or no GPU: nothing to make room for; an unreadable model: offload
    assert resolve_offload(cfg(tmp_path, *base, "placement.offload=true"), 2 * need)[0]
    assert not resolve_offload(cfg(tmp_path, *base, "placement.offload=false"), 1)[0]
    assert not resolve_offload(cfg(tmp_path), 1)[0]
    assert not resolve_offload(cfg(tmp_path, *base, "trainer.num_ranks=2"), 1)[0]
    assert not resolve_offload(c, None)[0]
    (model / "model.safetensors").unlink()
    assert placement.count_parameters(str(model)) is None
    assert resolve_offload(c, 2 * need)[0]


def test_the_launcher_and_the_sender_take_one_decision_of_the_transport(tmp_path):
    """sync.transport=auto is decided in one place (placement.choose_transport): the launcher's plan for the
    engines it places and the trainer's sender for the servers it reaches give the same answer for the same
    facts."""
    from rlx.sync.factory import pick_transport

    assert placement.choose_transport("shm", "cuda", remote=True) == "shm"  # a named one is kept
    cases = {
        ("cpu", False, True): "shm",
        ("cpu", True, True): "gloo",
        ("cuda", False, True): "cuda_ipc",
        ("cuda", True, True): "nccl",
        ("cuda", False, False): "nccl",
    }
    for (device, remote, sees), expected in cases.items():
        assert placement.choose_transport("auto", device, remote, sees) == expected
    for device in ("cpu", "cuda"):
        local, remote = ["ipc:///tmp/rlx-0.sock", "tcp://127.0.0.1:5555"], ["tcp://10.0.0.5:5555"]
        assert pick_transport("auto", device, local) == placement.choose_transport("auto", device)
        assert pick_transport("auto", device, local + remote) == placement.choose_transport("auto", device, True)
    c = cfg(tmp_path, "placement.mode=separate", "rollout.backend=vllm")
    assert plan(c, 2, peers).sync_transport == placement.choose_transport("auto", "cuda")
    assert plan(c, 2, no_peers).sync_transport == placement.choose_transport("auto", "cuda", engines_see_sender=False)
