"""Adapter-only LoRA sync (``model.lora.sync=adapter``) into real rollout servers -- ``hf`` (merges the
factors into its weights) and vLLM (serves them as its LoRA): the server's logprobs equal those of the
merged model, a second sync replaces the first (the hf merge starts from the kept base again, vLLM reloads
its LoRA in place), only the adapter's bytes move, and a whole weight sent to an adapter server is refused."""

import asyncio

import pytest
import torch

from rlx.config.errors import ConfigError
from rlx.config.model import LoraConfig, ModelConfig
from rlx.config.roles import trainer_role
from rlx.config.rollout import RolloutConfig
from rlx.config.schema import RunConfig
from rlx.config.trainer import TrainerConfig
from rlx.rollout.client import RolloutClient
from rlx.sync.errors import SyncError
from rlx.sync.sender import WeightSender
from rlx.trainer.lora import merged_named_tensors
from rlx.trainer.trainer import Trainer
from tests.helpers import serve_with

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "gate_proj"]}
SEQUENCES = [[5, 17, 23, 9, 40, 41, 42, 12], [30, 31, 8, 8, 60, 2], [11, 12, 13, 14, 15, 16, 17, 18, 19]]
START = [2, 1, 4]


def lora_trainer(model_dir, backend: str) -> Trainer:
    sync = "auto" if backend == "hf" else "adapter"  # auto: adapter on hf, merged on vllm
    cfg = RunConfig(
        model=ModelConfig(path=str(model_dir), lora=LoraConfig(**LORA, sync=sync)),
        rollout=RolloutConfig(backend=backend),
        trainer=TrainerConfig(device="cpu"),
    )
    assert cfg.lora_sync == "adapter"
    return Trainer(trainer_role(cfg))


@torch.no_grad()
def perturb_adapter(trainer: Trainer, seed: int) -> None:
    """Adapter weights as training would leave them (B starts at 0: give both factors values)."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in trainer.model.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)


@torch.no_grad()
def merged_logprobs(trainer: Trainer, model_dir) -> list[list[float]]:
    """The reference: a plain model holding the merged weights (what ``model.lora.sync=merged`` sends)."""
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    result = plain.load_state_dict(dict(merged_named_tensors(trainer.model)), strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}  # tied to the embedding
    out = []
    for ids, start in zip(SEQUENCES, START, strict=True):
        x = torch.tensor([ids])
        logp = plain(input_ids=x).logits.float()[0, :-1].log_softmax(-1).gather(-1, x[0, 1:, None]).squeeze(-1)
        out.append(logp[start - 1 :].tolist())
    return out


@pytest.mark.parametrize("backend", ["hf", pytest.param("vllm", marks=pytest.mark.slow)])
def test_adapter_sync_equals_merged_sync_and_moves_only_the_adapter(backend, tiny_model_dir, tmp_path):
    trainer = lora_trainer(tiny_model_dir, backend)
    adapter_bytes = sum(p.numel() * p.element_size() for n, p in trainer.model.named_parameters() if p.requires_grad)
    model_bytes = sum(t.numel() * t.element_size() for _, t in merged_named_tensors(trainer.model))

    async def sync_and_score(client, sender):
        await client.pause()
        try:
            report = await sender.send(trainer.named_tensors(), client.channels())
        finally:
            await client.resume()
        return report, await client.call(0, _score_request(), timeout_s=60.0)

    async def scenario(address):
        client = RolloutClient([address])
        try:
            with WeightSender(transport="shm", bucket_mb=1, timeout_s=60.0, verify=True) as sender:
                for seed in (1, 2):  # the second merge starts from the kept base, not from the first merge
                    perturb_adapter(trainer, seed)
                    report, scored = await sync_and_score(client, sender)
                    assert report.verified and report.total_bytes == adapter_bytes < model_bytes / 10
                    assert report.num_tensors == 2 * 3 * 2  # lora_A + lora_B, 3 target modules, 2 layers
                    expected = merged_logprobs(trainer, tiny_model_dir)
                    assert_logprobs(scored.logprobs, expected)
                # a whole weight at an adapter server (hf: it would leave the kept base stale): refused
                with pytest.raises(SyncError, match="model.lora.sync"):
                    await sender.send(list(merged_named_tensors(trainer.model)), client.channels())
                _, scored = await sync_and_score(client, sender)  # and the server still takes adapter syncs
                assert_logprobs(scored.logprobs, expected)
        finally:
            client.close()

    with serve_with(
        tiny_model_dir,
        tmp_path,
        f"{backend}-lora",
        rollout={"backend": backend},
        model={"lora": {**LORA, "sync": "adapter"}},
    ) as (address, _):
        asyncio.run(scenario(address))


def assert_logprobs(got: list[list[float]], expected: list[list[float]]) -> None:
    assert [len(g) for g in got] == [len(e) for e in expected]
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(torch.tensor(g), torch.tensor(e), rtol=0, atol=1e-5)


def _score_request():
    from rlx.rollout.protocol import ScoreTokens

    return ScoreTokens(token_ids=SEQUENCES, start=START)


def test_adapter_sync_that_cannot_run_is_a_config_error(tiny_model_dir):
    def config(backend="vllm", **lora):
        return RunConfig(
            model=ModelConfig(path=str(tiny_model_dir), lora=LoraConfig(**lora)), rollout=RolloutConfig(backend=backend)
        )

    with pytest.raises(ConfigError, match="vLLM serves LoRA adapters up to rank 512; set model.lora.sync=merged"):
        config(rank=1024, sync="adapter")
    assert config(backend="hf", rank=1024).lora_sync == "adapter"  # auto on hf; its merge has no rank limit
    assert config(rank=1024).lora_sync == "merged"  # auto on vLLM
    with pytest.raises(ConfigError, match="no adapter to sync; set model.lora.rank > 0"):
        config(rank=0, sync="adapter")
    with pytest.raises(ConfigError, match="model.lora.sync"):
        LoraConfig(rank=4, sync="delta")


def test_bench_sync_lora_rows_move_the_adapter_bytes(tiny_model_dir, tmp_path, our_segments):
    import json

    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from rlx.bench.lora import LORA_TARGETS
    from rlx.cli import app

    out = tmp_path / "bench.json"
    result = CliRunner().invoke(
        app,
        [
            "bench-sync",
            "--model",
            str(tiny_model_dir),
            "--bucket-mb",
            "1",
            "--repeats",
            "1",
            "--lora-rank",
            "4",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = {row["mode"]: row for row in json.loads(out.read_text())["rows"]}
    linear = [
        m
        for name, m in AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_modules()
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in LORA_TARGETS
    ]
    assert len(linear) == 2 * 7
    assert rows["adapter r4"]["bytes"] == sum(4 * (m.in_features + m.out_features) * 4 for m in linear)
    assert rows["merged r4"]["bytes"] == rows["ceiling"]["bytes"]  # the whole model
    assert "adapter-only moves" in " ".join(result.output.split())
    assert our_segments() == []
    bad = CliRunner().invoke(app, ["bench-sync", "--lora-rank", "-1"])
    assert bad.exit_code == 2 and "--lora-rank -1 must be >= 0" in bad.output
