"""Every advantage estimator, policy loss, rollout correction and KL placement runs end to end through
`rlx train` (the CLI in this process, its launcher starting real `hf` rollout server processes), and
two rollout servers both serve and both hold the trainer's exact weights after each sync.

Each run is 2 steps of a tiny random model. The task's own reward (exact answers) is always 0
for it, which zeroes every advantage, so the runs score completions by ``digit_share`` instead.
Four runs cover the four estimators; the other settings ride along (the policy loss, the KL
placement, the correction, two servers) because at step 1 none of them changes the gradient: the
policy is the reference and the rollout engine's, so the ratio and the correction weights are 1
and the KL and its gradient are 0. Step 1's gradient therefore depends on the estimator and the
samples alone, and runs on one server draw the same samples (one seed, one batch).
"""

from __future__ import annotations

import asyncio
import json
import math
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlx.cli import app
from rlx.formats.checkpoint import list_checkpoints
from tests.helpers import serve, write_config

# serial: the one_step_off run's second batch must be generated before the first update lands on its server,
# which a second test process loading the host can delay (it then samples on-policy: is_weight_mean 1.0)
pytestmark = [pytest.mark.slow, pytest.mark.serial]

STEPS = 2
N = 4  # samples per prompt
PROMPTS_PER_STEP = 4
MAX_TOKENS = 4
BASE = {
    "task": {"max_operand": 9, "num_eval": 8, "reward": "tests.launch.test_algorithms_e2e:digit_share"},
    "rollout": {"backend": "hf", "n": N, "max_tokens": MAX_TOKENS},
    "trainer": {
        "prompts_per_step": PROMPTS_PER_STEP,
        "micro_batch_size": 8,
        "lr": 1e-3,
        "eval_every": 0,
        "total_steps": STEPS,
        "seed": 3,
    },
}
KL_COEF = 0.1
RUNS = {
    "grpo": [
        "algorithm.advantage=grpo",
        "algorithm.policy_loss=ppo",
        f"algorithm.kl_coef={KL_COEF}",
        "algorithm.kl_in_reward=false",
        "logging.tensorboard=true",
        "rollout.num_servers=2",
        "sync.verify=true",
        "trace.enabled=true",
    ],
    "drgrpo": [
        "algorithm.advantage=drgrpo",
        "algorithm.policy_loss=gspo",
        "algorithm.clip_low=0.003",
        "algorithm.clip_high=0.004",
        f"algorithm.kl_coef={KL_COEF}",
        "algorithm.kl_in_reward=true",
    ],
    "rloo": [
        "algorithm.advantage=rloo",
        "algorithm.policy_loss=ppo",
        "trainer.mode=one_step_off",
        "algorithm.rollout_correction=icepop",
        "algorithm.correction_level=sequence",
        "algorithm.icepop_low=0.95",
        "algorithm.icepop_high=1.05",
    ],
    "reinforce_pp": [
        "algorithm.advantage=reinforce_pp",
        "algorithm.policy_loss=gspo",
        "trainer.mode=one_step_off",
        "algorithm.rollout_correction=icepop",
        "algorithm.correction_level=token",
        "sync.verify=true",
    ],
}
TWO_SERVER_RUN = "reinforce_pp"  # generates on two servers started here, which the last test inspects
LAUNCHED_TWO_SERVER_RUN = "grpo"  # rlx train launches two servers; their traces show what each did
ALWAYS = (
    "reward_mean",
    "reward_std",
    "loss",
    "grad_norm",
    "entropy",
    "clip_frac",
    "ratio_mean",
    "lr",
    "is_weight_mean",
    "logprob_diff_mean",
    "logprob_k3",
    "time_update",
    "time_sync",
)
GREEDY_PROMPTS = ["3+4=", "9-2=", "5+5="]


def digit_share(completion: str, answer: str) -> float:
    """A dense reward a random model earns some of: the share of digits in its completion."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


@dataclass
class Run:
    dir: Path
    rows: list[dict]
    """metrics.jsonl, one row per step."""


def train(work: Path, model_dir: Path, name: str, overrides: list[str], **sections) -> Run:
    """`rlx train` to the end, as a user runs it (the CLI, its launcher, its server processes)."""
    base = {k: dict(v) for k, v in BASE.items()}
    base["trainer"]["output_dir"] = str(work / name)
    for section, values in sections.items():
        base.setdefault(section, {}).update(values)
    config = write_config(work / f"{name}.yaml", model_dir, **base)
    result = CliRunner().invoke(app, ["train", str(config), *overrides])
    if result.exit_code != 0:
        log = work / name / "logs" / "train.log"
        detail = log.read_text()[-4000:] if log.exists() else repr(result.exception)
        pytest.fail(f"{name} run failed:\n{result.output[-2000:]}\n{detail}")
    rows = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), name
    return Run(work / name, rows)


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tmp_path_factory):
    """Two `rlx rollout-serve` processes (hf backend) that outlive the run using them."""
    with ExitStack() as stack:
        addresses = []
        for index in range(2):
            work = tmp_path_factory.mktemp(f"server{index}")
            addresses.append(stack.enter_context(serve(tiny_model_dir, "hf", work))[0])
        yield addresses


@pytest.fixture(scope="module")
def runs(tiny_model_dir, servers, tmp_path_factory) -> dict[str, Run]:
    work = tmp_path_factory.mktemp("algorithms")
    return {
        name: train(
            work,
            tiny_model_dir,
            name,
            overrides,
            **({"rollout": {"servers": servers}} if name == TWO_SERVER_RUN else {}),
        )
        for name, overrides in RUNS.items()
    }


@pytest.mark.parametrize("name", list(RUNS))
def test_each_setting_trains_with_finite_metrics(name, runs):
    for row in runs[name].rows:
        missing = [k for k in ALWAYS if k not in row]
        assert not missing, f"{name} step {row['step']} lacks {missing}"
        bad = {k: v for k, v in row.items() if v is None or isinstance(v, float) and not math.isfinite(v)}
        assert not bad, f"{name} step {row['step']} logged non-finite metrics {bad}"
    first = runs[name].rows[0]
    assert first["grad_norm"] > 0, f"{name}: the dense reward gave no gradient at step 1"
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # step 1 is on-policy in every mode


def test_estimators_give_different_updates_on_the_same_seed(runs):
    norms = {name: run.rows[0]["grad_norm"] for name, run in runs.items()}
    assert len({round(v, 6) for v in norms.values()}) == len(norms), f"two estimators gave one update: {norms}"
    drgrpo, rloo = runs["drgrpo"].rows[0], runs["rloo"].rows[0]
    if all(drgrpo[k] == rloo[k] for k in ("reward_mean", "reward_std", "response_len_mean")):
        # The same samples (one server, one seed): RLOO's advantages are n/(n-1) times Dr.GRPO's.
        assert rloo["grad_norm"] / drgrpo["grad_norm"] == pytest.approx(N / (N - 1), rel=1e-3)


@pytest.mark.parametrize("name, kl_in_loss", [("grpo", True), ("drgrpo", False)])
def test_kl_to_the_reference_in_the_loss_or_in_the_reward(name, kl_in_loss, runs):
    first, second = runs[name].rows
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: the policy is the reference
    assert 0 < second["kl"] < 1, f"{name}: KL after one update should be small and positive, got {second['kl']}"
    if second["response_len_mean"] == MAX_TOKENS:
        # Equal lengths and on-policy ratios: the policy term is -mean(A) = 0 for group-centred advantages,
        # so the loss is the KL term where it is in the loss, and nothing where it is in the reward.
        expected = KL_COEF * second["kl"] if kl_in_loss else 0.0
        assert second["loss"] == pytest.approx(expected, rel=1e-3, abs=1e-6)


def test_icepop_masks_stale_samples_at_sequence_level(runs):
    first, second = runs["rloo"].rows
    assert first["icepop_mask_frac"] == 0.0  # step 1's samples come from the trainer's own weights
    assert second["is_weight_mean"] != pytest.approx(1.0, abs=1e-6)  # step 2's were generated one update ago
    assert second["icepop_mask_frac"] > 0
    if second["response_len_mean"] == MAX_TOKENS:  # all sequences are full length
        trained = PROMPTS_PER_STEP * N * (1.0 - second.get("groups_no_signal", 0.0))  # groups with no signal: no update
        masked = second["icepop_mask_frac"] * trained
        assert masked == pytest.approx(round(masked), abs=1e-6), "sequence level masks whole sequences"
    token_level = runs["reinforce_pp"].rows[1]
    assert "icepop_mask_frac" in token_level and "tis_clip_frac" not in token_level


def test_tensorboard_sink_in_a_run(runs):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(runs["grpo"].dir / "tb"))
    events.Reload()
    logged = {e.step: e.value for e in events.Scalars("grad_norm")}
    assert logged == pytest.approx({r["step"]: r["grad_norm"] for r in runs["grpo"].rows})


def test_launched_servers_both_serve_and_load_every_sync(runs):
    run = runs[LAUNCHED_TWO_SERVER_RUN]
    spans = {}
    for path in (run.dir / "trace").glob("rollout*.jsonl"):
        spans[path.name.split(".")[0]] = [json.loads(line).get("n") for line in path.read_text().splitlines()[1:]]
    assert sorted(spans) == ["rollout0", "rollout1"]
    for server, names in spans.items():
        assert "generate" in names, f"{server} served no request"
        assert names.count("sync.end") == STEPS, f"{server} did not load every sync"  # each one verified (sync.verify)
    assert sum(names.count("generate") for names in spans.values()) == STEPS * PROMPTS_PER_STEP


def test_two_servers_both_served_and_hold_the_trainers_weights(runs, servers, tiny_model_dir):
    stats, greedy = asyncio.run(ask_servers(servers))
    assert [s.weight_version for s in stats] == [STEPS, STEPS], "every sync reached every server"
    assert all(s.completed > 0 for s in stats), f"a server served nothing: {stats}"
    assert sum(s.completed for s in stats) == STEPS * PROMPTS_PER_STEP
    final = list_checkpoints(runs[TWO_SERVER_RUN].dir / "checkpoints")[-1]
    trained = reference_logprobs(load_checkpoint_model(tiny_model_dir, final), greedy[0])
    initial = reference_logprobs(load_checkpoint_model(tiny_model_dir, None), greedy[0])
    for index, results in enumerate(greedy):
        for prompt, result, (argmax, logp) in zip(GREEDY_PROMPTS, results, trained, strict=True):
            sample = result.samples[0]
            assert sample.token_ids == argmax, f"server {index} decoded {prompt!r} unlike the trainer's checkpoint"
            assert sample.logprobs == pytest.approx(logp, abs=1e-4), f"server {index}, {prompt!r}"
    moved = max(abs(a - b) for (_, x), (_, y) in zip(trained, initial, strict=True) for a, b in zip(x, y, strict=True))
    assert moved > 1e-3, "training did not change the weights, so this comparison proves nothing"


async def ask_servers(addresses: list[str]):
    """Each server's stats, then its greedy completion of each prompt (one request at a time: no padding)."""
    from rlx.rollout import protocol as p
    from rlx.rollout.client import RolloutClient

    client = RolloutClient(addresses, timeout_s=60.0)
    greedy_spec = p.SamplingSpec(n=1, temperature=0.0, max_tokens=MAX_TOKENS)
    try:
        stats = await client.stats()  # before the greedy requests below add to the counts
        greedy = [
            [
                (await client.call(i, p.Generate(prompts=[prompt], sampling=greedy_spec))).results[0]
                for prompt in GREEDY_PROMPTS
            ]
            for i in range(len(addresses))
        ]
    finally:
        client.close()
    return stats, greedy


def load_checkpoint_model(model_dir: Path, checkpoint: Path | None):
    """The model of ``model_dir`` with a trainer checkpoint's weights (None: as built)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if checkpoint is not None:
        state = {k: v for f in sorted(checkpoint.glob("model*.safetensors")) for k, v in load_file(f).items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied to the embedding
    return model


def reference_logprobs(model, results) -> list[tuple[list[int], list[float]]]:
    """The model's argmax token and the served token's logprob at each position of each completion."""
    import torch

    out = []
    for result in results:
        prompt, completion = result.prompt_token_ids, result.samples[0].token_ids
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
        logp = logits.float().log_softmax(-1)
        out.append((logp.argmax(-1).tolist(), logp.gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()))
    return out
