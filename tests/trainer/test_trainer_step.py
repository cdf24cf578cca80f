"""Trainer.step on the tiny model: packed == padded, one pass == two passes, and logprobs that
match each sequence run alone through the plain model."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from rlx.config.algorithm import AlgorithmConfig
from rlx.config.model import ModelConfig
from rlx.config.roles import rollout_role, trainer_role
from rlx.config.schema import RunConfig
from rlx.config.trainer import TrainerConfig
from rlx.trainer.batch import build_batch
from rlx.trainer.logprobs import chunked_logprobs, completion_logprobs
from rlx.trainer.packing import micro_batches, plan_packed
from rlx.trainer.trainer import Trainer


def ragged_batch(rows: int = 12, seed: int = 123):
    gen = torch.Generator().manual_seed(seed)
    prompts, completions, logps, rewards = [], [], [], []
    for i in range(rows):
        prompts.append(torch.randint(4, 40, (2 + i % 3,), generator=gen).tolist())
        completion = torch.randint(4, 40, (1 + (i * 7) % 5,), generator=gen).tolist()
        completions.append(completion)
        logps.append([-1.0 - 0.1 * j for j in range(len(completion))])
        rewards.append(float((i * 5) % 3 == 0))
    return build_batch(prompts, completions, logps, rewards, pad_id=0)


def grouped_batch(groups: int = 4, n: int = 4, seed: int = 7):
    """``groups`` prompts of different lengths, ``n`` samples each with completions of different lengths."""
    gen = torch.Generator().manual_seed(seed)
    prompts, completions, logps, rewards = [], [], [], []
    for g in range(groups):
        prompt = torch.randint(4, 40, (2 + 3 * g,), generator=gen).tolist()
        for i in range(n):
            completion = torch.randint(4, 40, (1 + (g + 3 * i) % 6,), generator=gen).tolist()
            prompts.append(prompt)
            completions.append(completion)
            logps.append([-1.0 - 0.1 * j for j in range(len(completion))])
            rewards.append(float((g + i) % 3 == 0))
    return build_batch(prompts, completions, logps, rewards, pad_id=0)


def make_trainer(model_dir, algorithm=None, **trainer):
    torch.manual_seed(0)
    trainer.setdefault("lr", 1e-3)
    cfg = RunConfig(
        model=ModelConfig(path=str(model_dir)),
        algorithm=algorithm or AlgorithmConfig(),
        trainer=TrainerConfig(micro_batch_size=3, device="cpu", **trainer),
    )
    cfg.rollout.n = 4
    return Trainer(trainer_role(cfg))


def step_and_params(trainer, batch):
    metrics = {k: v for k, v in trainer.step(batch).items() if not k.startswith("time_")}
    return metrics, {name: t.clone() for name, t in trainer.named_tensors()}


def assert_same(a, b, tol):
    (ma, pa), (mb, pb) = a, b
    assert ma.keys() == mb.keys()
    for key in ma:
        assert ma[key] == pytest.approx(mb[key], rel=tol, abs=tol), key
    for name in pa:
        torch.testing.assert_close(pa[name], pb[name], rtol=tol, atol=tol)


def reference_logprobs(model_dir, batch, **load):
    """Each sequence alone, unpadded, through the plain transformers model and a float64 log-softmax."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, **load)
    out = torch.zeros(batch.mask.shape, dtype=torch.float64)
    prompt_len = batch.input_ids.shape[1] - batch.completion_ids.shape[1]
    for i in range(batch.size):
        ids = batch.input_ids[i][batch.attention_mask[i].bool()]
        num_completion = int(batch.mask[i].sum())
        num_prompt = ids.numel() - num_completion
        logits = model(input_ids=ids[None]).logits[0].double().log_softmax(-1)
        for j in range(num_completion):
            out[i, j] = logits[num_prompt - 1 + j, batch.completion_ids[i, j]]
        assert prompt_len >= num_prompt
    return out


@pytest.mark.parametrize("budget", [0, 40])
@pytest.mark.parametrize("split_head", [True, False])
def test_completion_logprobs_match_each_sequence_alone(tiny_model_dir, budget, split_head):
    trainer = make_trainer(tiny_model_dir, micro_batch_tokens=budget)
    batch = ragged_batch()
    with torch.no_grad():
        expected = reference_logprobs(tiny_model_dir, batch)
        for mb in micro_batches(batch, 0, 1, budget, 3):
            logp, entropy = completion_logprobs(trainer.model, mb, 1.0, 7, split_head=split_head)
            torch.testing.assert_close(logp.double(), expected[mb.rows], rtol=0, atol=1e-5)
            assert (entropy[mb.batch.mask == 0] == 0).all() and (entropy[mb.batch.mask == 1] > 0).all()


@pytest.fixture(scope="module", params=["gemma2", "gemma3", "qwen3"])
def family_dir(request, tmp_path_factory):
    """A tiny model of a family whose attention is not plain causal sdpa: Gemma 2's soft-capping and sliding window
    on alternate layers, Gemma 3's window and q/k norms (Qwen3's q/k norms beside them, plain attention)."""
    from rlx.trainer.tiny import build_tiny_family

    return build_tiny_family(tmp_path_factory.mktemp(request.param) / "model", request.param)


@pytest.mark.parametrize("budget", [0, 200])
def test_windowed_and_soft_capped_attention_logprobs_match_each_sequence_alone(family_dir, budget):
    """Sequences longer than the families' window of 8 keys: the packed forward caps and windows its scores as the
    model's own eager attention does."""
    trainer = make_trainer(family_dir, micro_batch_tokens=budget)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(4, 40, (6 + 3 * i,), generator=gen).tolist() for i in range(6)]
    completions = [torch.randint(4, 40, (4 + (i * 5) % 7,), generator=gen).tolist() for i in range(6)]
    batch = build_batch(prompts, completions, [[-1.0] * len(c) for c in completions], [0.0] * 6, pad_id=0)
    with torch.no_grad():
        expected = reference_logprobs(family_dir, batch, attn_implementation="eager")
        for mb in micro_batches(batch, 0, 1, budget, 3):
            logp, _ = completion_logprobs(trainer.model, mb, 1.0, 7, split_head=False)
            torch.testing.assert_close(logp.double(), expected[mb.rows], rtol=0, atol=1e-5)


def test_packed_step_equals_padded_step(tiny_model_dir):
    batch = ragged_batch()
    padded = step_and_params(make_trainer(tiny_model_dir, micro_batch_tokens=0), batch)
    packed = step_and_params(make_trainer(tiny_model_dir, micro_batch_tokens=40), batch)
    assert packed[0]["update_tokens"] == float(batch.attention_mask.sum())
    assert_same(packed, padded, 1e-5)


@pytest.mark.parametrize("split_head", [True, False])
def test_shared_prompt_logprobs_match_each_sequence_alone(tiny_model_dir, split_head):
    trainer = make_trainer(tiny_model_dir, micro_batch_tokens=40)
    batch = grouped_batch()
    micro = micro_batches(batch, 0, 1, 40, 3, group_size=4, share_prompts=True)
    assert any(mb.packed.kv_index is not None for mb in micro)
    with torch.no_grad():
        expected = reference_logprobs(tiny_model_dir, batch)
        for mb in micro:
            logp, _ = completion_logprobs(trainer.model, mb, 1.0, 7, split_head=split_head)
            torch.testing.assert_close(logp.double(), expected[mb.rows], rtol=0, atol=1e-5)


@pytest.mark.parametrize("budget", [20, 16384])
def test_shared_prompt_step_equals_padded_step(tiny_model_dir, budget):
    """The same loss, metrics and updated weights with each group's prompt once; fewer tokens through
    the model: the prompt's length times n - 1 per group where a group fits one micro-batch."""
    batch = grouped_batch()  # lr 1e-4: Adam's first step moves every weight by about lr, whatever its gradient
    padded = step_and_params(make_trainer(tiny_model_dir, micro_batch_tokens=0, lr=1e-4), batch)
    shared = step_and_params(make_trainer(tiny_model_dir, micro_batch_tokens=budget, lr=1e-4), batch)
    repeated = step_and_params(
        make_trainer(tiny_model_dir, micro_batch_tokens=budget, lr=1e-4, share_prompts=False), batch
    )
    saved = repeated[0].pop("update_tokens") - shared[0].pop("update_tokens")
    padded[0].pop("update_tokens")
    assert_same(shared, padded, 1e-5)
    assert_same(repeated, padded, 1e-5)
    prompt_lens = [2 + 3 * g for g in range(4)]
    if budget == 16384:
        assert saved == sum(3 * p for p in prompt_lens)
    else:  # groups split where they pass the budget save less, but something
        assert 0 < saved < sum(3 * p for p in prompt_lens)


def test_plan_units_keep_a_group_together_within_the_budget():
    from rlx.trainer.packing import plan_units

    batch = grouped_batch()
    units, costs = plan_units(batch, 4, budget=14)
    assert sorted(r for unit in units for r in unit) == list(range(batch.size))
    lengths = batch.attention_mask.sum(dim=1).tolist()
    prompt = [lengths[r] - int(batch.mask[r].sum()) for r in range(batch.size)]
    for unit, cost in zip(units, costs, strict=True):
        assert len({r // 4 for r in unit}) == 1 and unit == list(range(unit[0], unit[-1] + 1))
        assert cost == prompt[unit[0]] + sum(int(batch.mask[r].sum()) for r in unit)
        assert len(unit) == 1 or cost <= 14
    assert len(units) > 4  # the long-prompt groups were split
    different = build_batch([[5, 6], [7, 8, 9]], [[10], [11]], [[-1.0], [-1.0]], [0.0, 1.0], pad_id=0)
    assert plan_units(different, 2, budget=100) == ([[0], [1]], [3, 4])


def test_shared_prompt_attention_matches_each_sequence_alone():
    """The CPU branch with shared prompts: each completion sees its prompt (kept once in the row) and its own
    earlier tokens, forward and backward, as when the prompt is repeated before it."""
    from rlx.trainer.attention import packed_attention

    torch.manual_seed(0)
    prompt, completions = 5, [3, 1, 4]
    total = prompt + sum(completions)
    q, k, v = (torch.randn(1, heads, total, 8, dtype=torch.float64, requires_grad=True) for heads in (4, 2, 2))
    starts = [prompt + sum(completions[:i]) for i in range(len(completions))]
    keys = list(range(prompt + completions[0])) + [
        p for s, c in zip(starts[1:], completions[1:], strict=True) for p in [*range(prompt), *range(s, s + c)]
    ]
    query_lens = [prompt + completions[0], *completions[1:]]
    key_lens = [prompt + c for c in completions]

    def cu(lens):
        return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)

    out, _ = packed_attention(
        None,
        q,
        k,
        v,
        None,
        cu_seq_lens_q=cu(query_lens),
        max_length_q=max(query_lens),
        cu_seq_lens_k=cu(key_lens),
        max_length_k=max(key_lens),
        rlx_kv_index=torch.tensor(keys),
    )
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    ref = []
    for i, (s, c) in enumerate(zip(starts, completions, strict=True)):
        rows = torch.tensor([*range(prompt), *range(s, s + c)])
        seq = [t[:, :, rows] for t in (q, k, v)]
        o = F.scaled_dot_product_attention(seq[0], *(t.repeat_interleave(2, 1) for t in seq[1:]), is_causal=True)
        ref.append(o if i == 0 else o[:, :, prompt:])
    ref = torch.cat(ref, dim=2).transpose(1, 2)
    # the prompt's queries are computed once (in the first sequence); the others' copies are not used
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    torch.testing.assert_close(out, ref)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("budget, mode", [(0, "sync"), (40, "sync"), (40, "one_step_off"), (0, "fully_async")])
def test_one_pass_equals_two_passes(tiny_model_dir, budget, mode):
    """Also for stale samples: their rollout logprobs (not the trainer's) differ, and the correction's
    weights from the update's own detached logprobs equal those of a separate pass."""
    batch = ragged_batch()
    tis = AlgorithmConfig(rollout_correction="tis")  # PPO's ratio against the old logprobs, weights from TIS
    fused = make_trainer(tiny_model_dir, algorithm=tis, micro_batch_tokens=budget, mode=mode)
    assert fused.fused_logprobs
    two_pass = make_trainer(tiny_model_dir, algorithm=tis, micro_batch_tokens=budget, mode=mode)
    two_pass.fused_logprobs = False
    one, two = step_and_params(fused, batch), step_and_params(two_pass, batch)
    assert one[0]["ratio_mean"] == 1.0 and one[0]["clip_frac"] == 0.0
    if mode != "sync":
        assert one[0]["is_weight_mean"] != pytest.approx(1.0, abs=1e-3)  # the correction acts on this batch
    assert_same(one, two, 1e-6)


def _with_rollout_logp(batch, rollout_logp):
    import dataclasses

    return dataclasses.replace(batch, rollout_logp=rollout_logp.float() * batch.mask)


def test_bypass_takes_the_ppo_ratio_against_the_rollout_logprobs(tiny_model_dir):
    """``bypass``: PPO's clip bounds each token's move from the weights that sampled it. Rollout logprobs equal
    to the trainer's give sync's step exactly; rollout logprobs that put every token past the clip in its
    advantage's direction (as a stale sample's tokens the policy has already moved) give no gradient at all,
    where TIS still pushes them further."""
    batch = grouped_batch()
    current = reference_logprobs(tiny_model_dir, batch)
    bypass, tis = AlgorithmConfig(rollout_correction="bypass"), AlgorithmConfig(rollout_correction="tis")
    on_policy = _with_rollout_logp(batch, current)
    assert_same(
        step_and_params(make_trainer(tiny_model_dir, algorithm=bypass, lr=1e-4), on_policy),
        step_and_params(make_trainer(tiny_model_dir, lr=1e-4), on_policy),
        1e-5,
    )

    rewards = batch.rewards.view(-1, 4)
    sign = torch.sign(rewards - rewards.mean(dim=1, keepdim=True)).view(-1, 1)  # of each row's GRPO advantage
    assert (sign > 0).any() and (sign < 0).any()
    moved = _with_rollout_logp(batch, current - sign)  # ratio e past 1 + clip_high, 1/e below 1 - clip_low
    metrics = make_trainer(tiny_model_dir, algorithm=bypass, mode="fully_async").step(moved)
    assert metrics["grad_norm"] == 0.0
    real = batch.mask * (sign != 0)
    assert metrics["clip_frac"] == pytest.approx(float(real.sum() / batch.mask.sum()), abs=1e-6)
    assert make_trainer(tiny_model_dir, algorithm=tis, mode="fully_async").step(moved)["grad_norm"] > 1e-3


def test_auto_correction_is_bypass_off_policy_and_none_on_policy():
    assert RunConfig(trainer=TrainerConfig(mode="sync")).correction == "none"
    for mode in ("one_step_off", "fully_async"):
        assert RunConfig(trainer=TrainerConfig(mode=mode)).correction == "bypass"
    assert (
        RunConfig(
            trainer=TrainerConfig(mode="fully_async"), algorithm=AlgorithmConfig(rollout_correction="tis")
        ).correction
        == "tis"
    )


@pytest.mark.parametrize(
    "kwargs, algorithm",
    [
        ({"epochs_per_step": 2}, None),
        ({}, AlgorithmConfig(kl_coef=0.1)),
    ],
)
def test_separate_logprob_pass_where_old_differs_from_current(tiny_model_dir, kwargs, algorithm):
    trainer = make_trainer(tiny_model_dir, algorithm=algorithm, **kwargs)
    assert not trainer.fused_logprobs
    metrics = trainer.step(ragged_batch())
    assert metrics["time_logprob"] > 0


def test_dropout_keeps_the_separate_pass(tiny_model_dir, tmp_path):
    import json
    import shutil

    model_dir = tmp_path / "dropout"
    shutil.copytree(tiny_model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["attention_dropout"] = 0.1
    (model_dir / "config.json").write_text(json.dumps(config))
    assert not make_trainer(model_dir).fused_logprobs


def test_entropy_bonus_and_kl_loss_match_padded(tiny_model_dir):
    algorithm = AlgorithmConfig(entropy_coef=0.01, kl_coef=0.05)
    batch = ragged_batch()
    padded = step_and_params(make_trainer(tiny_model_dir, algorithm=algorithm, micro_batch_tokens=0), batch)
    packed = step_and_params(make_trainer(tiny_model_dir, algorithm=algorithm, micro_batch_tokens=40), batch)
    assert "kl" in packed[0]
    # AdamW divides each update by its gradient's running scale, so an entry whose gradient is near zero turns a
    # last-bit difference between the packed and padded forwards into up to ~1e-5 of its lr=1e-3 step (seen on 1
    # of 8192 entries with transformers 5.19); the metrics (loss, entropy, kl) agree to 1e-5.
    for key in padded[0]:
        assert packed[0][key] == pytest.approx(padded[0][key], rel=1e-5, abs=1e-5), key
    assert_same(packed, padded, 5e-5)


@pytest.mark.parametrize("budget", [0, 40])
def test_groups_without_signal_stay_out_of_the_update_and_change_nothing(tiny_model_dir, budget):
    """Groups whose rewards are all equal have zero advantages: leaving them out of the forward and backward
    gives the same loss, gradient norm and weights, over two steps (the second with no signal at all, where
    AdamW's momentum still moves the weights), and fewer tokens through the model."""
    import dataclasses

    batch = grouped_batch()
    rewards = batch.rewards.clone()
    rewards[4:8], rewards[12:16] = 1.0, 0.0  # groups 1 and 3: no signal
    signal = dataclasses.replace(batch, rewards=rewards)
    flat = dataclasses.replace(batch, rewards=torch.full_like(rewards, 0.5))
    skipping = make_trainer(tiny_model_dir, micro_batch_tokens=budget, lr=1e-4)
    full = make_trainer(tiny_model_dir, micro_batch_tokens=budget, lr=1e-4, skip_no_signal=False)
    assert skipping.skip_no_signal and not full.skip_no_signal
    for step_batch, left_out in ((signal, 0.5), (flat, 1.0)):
        (got, got_params), (want, want_params) = (
            step_and_params(skipping, step_batch),
            step_and_params(full, step_batch),
        )
        assert got.pop("groups_no_signal") == left_out and "groups_no_signal" not in want
        assert got["update_tokens"] < want["update_tokens"]
        for key in ("loss", "grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
        for name in want_params:
            torch.testing.assert_close(got_params[name], want_params[name], rtol=1e-5, atol=1e-5)
    assert want["grad_norm"] == 0.0 and any(
        not torch.equal(p, q)
        for p, q in zip(want_params.values(), (t for _, t in make_trainer(tiny_model_dir).named_tensors()), strict=True)
    )


@pytest.mark.parametrize("algorithm", [AlgorithmConfig(kl_coef=0.05), AlgorithmConfig(entropy_coef=0.01)])
def test_groups_without_signal_still_train_where_another_term_reads_them(tiny_model_dir, algorithm):
    assert not make_trainer(tiny_model_dir, algorithm=algorithm).skip_no_signal


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("temperature, entropy_coef", [(1.0, 0.0), (0.7, 0.3)])
def test_chunked_head_gradients_match_autograd(temperature, entropy_coef, device):
    """On CUDA the chunk's statistics and its logits' gradient are ``torch.compile``d kernels (``_fused``); they give
    autograd's gradients of the plain log-softmax, at a vocabulary of a real model's size (logits / 0.7 up to ~35
    there, where entropy as lse - sum(p * z) lost 2e-4 to cancellation)."""
    torch.manual_seed(0)
    tokens, width, vocab = (300, 64, 49152)
    hidden = torch.randn(tokens, width, dtype=torch.float32, device=device, requires_grad=True)
    weight = torch.randn(vocab, width, device=device, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,), device=device)
    coef = torch.randn(tokens, device=device)
    logp, entropy = chunked_logprobs(hidden, weight, targets, temperature, 128)
    grads = torch.autograd.grad((coef * (logp + entropy_coef * entropy)).sum(), (hidden, weight))
    log_probs = ((hidden @ weight.t()) / temperature).log_softmax(-1)
    ref_logp = log_probs.gather(-1, targets[:, None]).squeeze(-1)
    ref_entropy = -(log_probs.exp() * log_probs).sum(-1)
    ref_grads = torch.autograd.grad((coef * (ref_logp + entropy_coef * ref_entropy)).sum(), (hidden, weight))
    torch.testing.assert_close(logp, ref_logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, rtol=1e-4, atol=1e-4)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_plan_balances_tokens_and_gives_every_rank_the_same_count():
    lengths = [900, 850, 40, 30, 700, 20, 10, 400, 390, 5, 600]
    plans = plan_packed(lengths, world=3, budget=1000)
    assert len({len(p) for p in plans}) == 1
    rows = sorted(r for plan in plans for mb in plan for r in mb)
    assert rows == list(range(len(lengths)))
    loads = [sum(lengths[r] for mb in plan for r in mb) for plan in plans]
    assert max(loads) - min(loads) <= max(lengths)
    for plan in plans:
        for mb in plan:
            assert len(mb) == 1 or sum(lengths[r] for r in mb) <= 1000


def test_plan_gives_fillers_to_ranks_short_of_sequences():
    plans = plan_packed([3000, 10], world=2, budget=1000)
    assert [len(p) for p in plans] == [1, 1]
    plans = plan_packed([10], world=2, budget=1000)
    assert sorted(plans) == [[[]], [[0]]]


def test_trainer_micro_batch_tokens_must_not_be_negative():
    from rlx.config.errors import ConfigError

    with pytest.raises(ConfigError, match="trainer.micro_batch_tokens"):
        TrainerConfig(micro_batch_tokens=-1)


@pytest.mark.gpu
@pytest.mark.parametrize("grouped", [False, True])
def test_packed_varlen_attention_on_gpu_matches_padded(tiny_model_dir, grouped):
    """Packed (with shared prompts where a group's samples share one) against padded, bf16 on CUDA."""
    batch = grouped_batch(groups=6) if grouped else ragged_batch(rows=16)
    results = []
    for budget in (0, 60):
        torch.manual_seed(0)
        cfg = RunConfig(
            model=ModelConfig(path=str(tiny_model_dir), dtype="bfloat16"),
            trainer=TrainerConfig(micro_batch_size=4, micro_batch_tokens=budget, device="cuda", lr=1e-3),
        )
        cfg.rollout.n = 4
        results.append(step_and_params(Trainer(trainer_role(cfg)), batch))
    (padded, _), (packed, _) = results
    assert (packed["update_tokens"] < padded["update_tokens"]) == grouped
    for key in ("loss", "entropy", "logprob_diff_mean", "grad_norm"):
        assert packed[key] == pytest.approx(padded[key], rel=2e-2, abs=2e-3), key


def test_every_epoch_takes_an_optimizer_step(tiny_model_dir):
    """With epochs_per_step=2 the second pass sees the weights the first pass updated, so its
    ratios move off 1 and the clip can act; one step per RL step would leave the ratio at exactly 1."""
    batch = ragged_batch()
    one = make_trainer(tiny_model_dir, lr=0.05, epochs_per_step=1).step(batch)
    two = make_trainer(tiny_model_dir, lr=0.05, epochs_per_step=2).step(batch)
    assert one["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert two["ratio_max"] > 1.0 + 1e-3
    assert two["clip_frac"] > 0.0


@pytest.mark.gpu
@pytest.mark.parametrize("lengths", [[640] * 6, [100, 900, 40, 700], [5000, 4500]])
def test_packed_attention_on_gpu_matches_per_sequence_float32(lengths):
    """Each branch (varlen, or padded rows, and one sdpa call per long sequence) gives what float32
    causal attention over each sequence alone gives, forward and backward."""
    from rlx.trainer.attention import packed_attention

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    total = sum(lengths)
    q, k, v = (
        torch.randn(1, heads, total, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for heads in (8, 4, 4)
    )
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
    out, _ = packed_attention(None, q, k, v, None, cu_seq_lens_q=cu, max_length_q=max(lengths))
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = torch.cat(
        [
            F.scaled_dot_product_attention(
                q32[:, :, s:e],
                k32[:, :, s:e].repeat_interleave(2, 1),
                v32[:, :, s:e].repeat_interleave(2, 1),
                is_causal=True,
            )
            for s, e in itertools.pairwise(cu.tolist())
        ],
        dim=2,
    ).transpose(1, 2)
    ref_grads = torch.autograd.grad(ref, (q32, k32, v32), grad_out.float())
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("prompt, completions", [(300, [200, 40, 500, 1]), (4000, [3000, 5000])])
def test_shared_prompt_attention_on_gpu_matches_repeated_float32(prompt, completions):
    """Shared prompts through each GPU branch (one varlen call with fewer queries than keys, or one sdpa call
    per long sequence with the mask aligned to the last key) against float32 causal attention over the prompt
    repeated before each completion, forward and backward."""
    from rlx.trainer.attention import packed_attention

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    total = prompt + sum(completions)
    q, k, v = (
        torch.randn(1, heads, total, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for heads in (8, 4, 4)
    )
    starts = [prompt + sum(completions[:i]) for i in range(len(completions))]
    spans = [
        torch.tensor([*range(prompt), *range(s, s + c)], device="cuda")
        for s, c in zip(starts, completions, strict=True)
    ]
    query_lens = [prompt + completions[0], *completions[1:]]
    key_lens = [prompt + c for c in completions]

    def cu(lens):
        return torch.tensor([0, *itertools.accumulate(lens)], device="cuda", dtype=torch.int32)

    out, _ = packed_attention(
        None,
        q,
        k,
        v,
        None,
        cu_seq_lens_q=cu(query_lens),
        max_length_q=max(query_lens),
        cu_seq_lens_k=cu(key_lens),
        max_length_k=max(key_lens),
        rlx_kv_index=torch.cat(spans),
    )
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = []
    for i, rows in enumerate(spans):
        o = F.scaled_dot_product_attention(
            q32[:, :, rows],
            k32[:, :, rows].repeat_interleave(2, 1),
            v32[:, :, rows].repeat_interleave(2, 1),
            is_causal=True,
        )
        ref.append(o if i == 0 else o[:, :, prompt:])
    ref = torch.cat(ref, dim=2).transpose(1, 2)
    ref_grads = torch.autograd.grad(ref, (q32, k32, v32), grad_out.float())
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)


def test_fused_kernels_stay_off_on_a_cpu_and_on_is_refused(tiny_model_dir):
    from rlx.config.errors import ConfigError
    from rlx.trainer.kernels import apply_fused_kernels

    trainer = make_trainer(tiny_model_dir)  # fused_kernels=auto on a CPU: the model keeps its own modules
    norm = trainer.model.model.norm
    assert "forward" not in vars(norm) and "forward" not in vars(trainer.model.model.layers[0].mlp)
    with pytest.raises(ValueError, match="fused_kernels=on: the trainer runs on cpu"):
        apply_fused_kernels(trainer.model, "on", torch.device("cpu"))
    with pytest.raises(ConfigError, match="trainer.fused_kernels=on with trainer.device=cpu"):
        TrainerConfig(fused_kernels="on", device="cpu")


@pytest.mark.gpu
def test_fused_kernels_give_the_same_step_on_gpu(tiny_model_dir):
    """Liger's RMSNorm and SwiGLU on the trainer's model: same loss, logprobs and gradients as without."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("liger_kernel", reason="the fused kernels come from liger-kernel: pip install liger-kernel")
    batch = ragged_batch(rows=16)
    results = []
    for mode in ("off", "on"):
        torch.manual_seed(0)
        cfg = RunConfig(
            model=ModelConfig(path=str(tiny_model_dir)),
            trainer=TrainerConfig(
                micro_batch_size=4, micro_batch_tokens=60, device="cuda", lr=1e-3, fused_kernels=mode
            ),
        )
        cfg.rollout.n = 4
        trainer = Trainer(trainer_role(cfg))
        assert ("forward" in vars(trainer.model.model.norm)) == (mode == "on")
        results.append(step_and_params(trainer, batch))
    assert_same(results[1], results[0], 1e-4)


def test_cpu_threads_sets_the_trainers_and_the_hf_servers_threads(tiny_model_dir, tmp_path):
    """trainer.cpu_threads and rollout.cpu_threads set the process's intra-op threads on a CPU; 0 leaves them."""
    from rlx.config import ConfigError, load_config
    from rlx.rollout.backends.hf import HfBackend

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        make_trainer(tiny_model_dir, cpu_threads=0)
        assert torch.get_num_threads() == 2
        make_trainer(tiny_model_dir, cpu_threads=1)
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        cfg = RunConfig(model=ModelConfig(path=str(tiny_model_dir)))
        cfg.rollout.backend, cfg.rollout.device, cfg.rollout.cpu_threads = "hf", "cpu", 1
        HfBackend(rollout_role(cfg))._load()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    (tmp_path / "run.yaml").write_text(f"model:\n  path: {tiny_model_dir}\n")
    for key in ("trainer.cpu_threads", "rollout.cpu_threads"):
        with pytest.raises(ConfigError, match=key):
            load_config(tmp_path / "run.yaml", [f"{key}=-1"])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("shared", [True, False])
def test_block_attention_equals_one_row_per_sequence(tiny_model_dir, shared, device):
    """The block layout (a shared prompt and its completions in one block, or one sequence per block) gives the
    logprobs and gradients of the one-row-per-sequence layout (float32; on CUDA too, where bf16 takes varlen)."""
    from rlx.trainer.packing import MicroBatch, pack

    batch = grouped_batch() if shared else ragged_batch()
    results = []
    for blocks in (True, False):
        trainer = make_trainer(tiny_model_dir)
        trainer.model.to(device)
        layout = pack(batch, share_prompts=shared, blocks=blocks)
        assert (layout.blocks is not None) == blocks and (layout.kv_index is not None) == shared
        mb = MicroBatch(torch.arange(batch.size), batch, layout, layout.input_ids.shape[1]).to(torch.device(device))
        logp, entropy = completion_logprobs(trainer.model, mb, 1.0, 7, split_head=True, entropy_grad=True)
        (logp.sum() + entropy.sum()).backward()
        results.append(
            (
                logp.detach().cpu(),
                entropy.detach().cpu(),
                {n: p.grad.cpu() for n, p in trainer.model.named_parameters()},
            )
        )
    (logp_b, ent_b, grads_b), (logp_s, ent_s, grads_s) = results
    torch.testing.assert_close(logp_b, logp_s, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_b, ent_s, rtol=1e-5, atol=1e-5)
    for name in grads_s:
        torch.testing.assert_close(grads_b[name], grads_s[name], rtol=1e-4, atol=1e-5)
    if shared:  # group by group in row order: no permutation back
        assert layout.kv_index is not None and pack(batch, True, True).blocks.inverse is None


def test_blocks_are_chosen_for_short_sequences_only():
    from rlx.trainer.packing import blocks_layout

    def layout(groups: int, n: int, prompt: int, completion: int):
        """``groups`` prompts of ``prompt`` tokens, each followed by ``n`` completions of ``completion`` tokens."""
        block_of, sequence, is_prompt = [], [], []
        for g in range(groups):
            for s in range(n):
                count = (prompt if s == 0 else 0) + completion
                block_of += [g] * count
                sequence += [g * n + s] * count
                is_prompt += [s == 0 and i < prompt for i in range(count)]
        return blocks_layout(
            torch.tensor(block_of),
            torch.tensor(sequence),
            torch.tensor(is_prompt),
            groups * n,
            prompt + completion,
            prompt + completion,
        )

    quickstart = layout(32, 8, 7, 4)  # 256 sequences of a few tokens: 32 blocks of 39
    assert quickstart is not None and tuple(quickstart.index.shape) == (32, 39)
    assert quickstart.mask.shape == (32, 1, 39, 39)
    # the second completion's first token sees the prompt and itself, not the first completion
    second = 7 + 4
    assert quickstart.mask[0, 0, second].tolist() == [True] * 7 + [False] * 4 + [True] + [False] * 27
    assert layout(16, 8, 20, 80) is None  # completions of 80 tokens: a block of 660 costs more than 8 rows of 100


def test_compute_dtype_runs_the_forward_in_bfloat16_over_float32_weights(tiny_model_dir):
    """model.compute_dtype=bfloat16: the matrix products run in bfloat16 (the logprobs leave the float32 model's
    by bfloat16's rounding) while the weights, and a step's update to them, stay float32."""
    cfg = RunConfig(
        model=ModelConfig(path=str(tiny_model_dir), compute_dtype="bfloat16"),
        trainer=TrainerConfig(micro_batch_size=3, micro_batch_tokens=0, device="cpu", lr=1e-3),
    )
    cfg.rollout.n = 4
    trainer = Trainer(trainer_role(cfg))
    batch = ragged_batch()
    with torch.no_grad():
        exact = reference_logprobs(tiny_model_dir, batch)
        mb = micro_batches(batch, 0, 1, 0, batch.size)[0]
        logp, _ = completion_logprobs(trainer.model, mb, 1.0, 7, split_head=True)
    scored = batch.mask.bool()
    gap = (logp[scored].double() - exact[scored]).abs()
    assert 1e-4 < gap.mean() < 0.05, f"mean |bf16 autocast - float32| = {gap.mean():.2e}"
    before = {name: t.clone() for name, t in trainer.named_tensors()}
    trainer.step(batch)
    after = dict(trainer.named_tensors())
    assert all(t.dtype == torch.float32 for t in after.values())
    assert any(not torch.equal(before[name], t) for name, t in after.items())


@pytest.mark.parametrize("advantage", ["grpo", "gae"])
def test_a_step_with_a_nan_loss_is_skipped_and_leaves_weights_and_optimizer_untouched(tiny_model_dir, advantage):
    trainer = make_trainer(tiny_model_dir, algorithm=AlgorithmConfig(advantage=advantage), epochs_per_step=2)
    trainer.step(grouped_batch())  # the optimizer has state (moments) to keep
    before = {name: t.clone() for name, t in trainer.named_tensors()}
    moments = [v.clone() for state in trainer.optimizer.state.values() for v in state.values()]
    critic = [p.detach().clone() for p in trainer.critic.model.parameters()] if trainer.critic else []
    schedule = trainer.scheduler.last_epoch
    poisoned = grouped_batch()
    poisoned.rewards[5] = float("nan")  # as a dump with a NaN reward delivered it
    metrics = trainer.step(poisoned)
    assert metrics["skipped_nonfinite"] == (2.0 if advantage == "grpo" else 3.0)  # two passes (+ the critic's step)
    assert not math.isfinite(metrics["loss"]) and trainer.scheduler.last_epoch == schedule
    for name, tensor in trainer.named_tensors():
        assert torch.equal(tensor, before[name]), name
    assert all(
        torch.equal(a, b)
        for a, b in zip(moments, (v for state in trainer.optimizer.state.values() for v in state.values()), strict=True)
    )
    if advantage == "gae":
        assert metrics["critic_skipped_nonfinite"] == 1.0
        assert all(torch.equal(a, p) for a, p in zip(critic, trainer.critic.model.parameters(), strict=True))
    metrics = trainer.step(grouped_batch())  # the next good batch trains from the same weights
    assert metrics["skipped_nonfinite"] == 0.0 and math.isfinite(metrics["grad_norm"])
    assert any(not torch.equal(tensor, before[name]) for name, tensor in trainer.named_tensors())
    assert all(torch.isfinite(tensor).all() for _, tensor in trainer.named_tensors())


@pytest.mark.parametrize("temperature, divisor", [(0.0, 1.0), (0.6, 0.6)])
def test_trainer_divides_its_logits_by_the_sampling_temperature(tiny_model_dir, temperature, divisor):
    cfg = RunConfig(model=ModelConfig(path=str(tiny_model_dir)), trainer=TrainerConfig(device="cpu"))
    cfg.rollout.temperature, cfg.rollout.n, cfg.rollout.max_tokens = temperature, 2, 9
    trainer = Trainer(trainer_role(cfg))
    assert trainer.temperature == divisor
    assert (trainer.sampling.n, trainer.sampling.max_tokens) == (2, 9)


@pytest.mark.parametrize("budget", [0, 64])
def test_warm_pass_changes_nothing_a_step_sees(tiny_model_dir, budget):
    """The launcher's warm-up pass scores and back-propagates, and leaves the weights, gradients and optimizer
    state as they were: the step after it is the step without it, bit for bit."""
    cold, warm = (
        make_trainer(tiny_model_dir, micro_batch_tokens=budget),
        make_trainer(tiny_model_dir, micro_batch_tokens=budget),
    )
    assert warm.warm_pass() == 32  # two samples of 16 completion tokens
    assert all(p.grad is None for p in warm.model.parameters()) and not warm.optimizer.state
    assert warm.warm_up() == 0.0  # on a CPU the launcher's warm-up does nothing
    cold_metrics, cold_params = step_and_params(cold, grouped_batch())
    warm_metrics, warm_params = step_and_params(warm, grouped_batch())
    assert cold_metrics == warm_metrics
    assert all(torch.equal(cold_params[k], warm_params[k]) for k in cold_params)
