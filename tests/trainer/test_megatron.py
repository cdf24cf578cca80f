"""trainer.backend=megatron on one process (TP = PP = 1, gloo): megatron-core's GPTModel against the FSDP2
backend's transformers model on the same batch, in float32. Logprobs and entropy agree to 1e-5, one update
(the same Trainer, loss code and AdamW) gives the same weights, and the sync's tensors are the Hugging Face
model's, bit for bit, before any update. Then the pre-flight refusals of layouts and features."""

import re

import pytest
import torch
from safetensors.torch import load_file

from rlx.config.algorithm import AlgorithmConfig
from rlx.config.errors import ConfigError
from rlx.config.megatron import MegatronConfig
from rlx.config.model import LoraConfig, ModelConfig
from rlx.config.roles import trainer_role
from rlx.config.schema import RunConfig
from rlx.config.trainer import TrainerConfig
from rlx.convert.errors import ConvertError
from rlx.trainer.packing import micro_batches
from rlx.trainer.tiny import build_tiny_model
from rlx.trainer.trainer import Trainer
from tests.convert.convert_helpers import build_family_model
from tests.trainer.test_trainer_step import grouped_batch, ragged_batch

pytest.importorskip("megatron.core")

LOGPROB_ATOL = 1e-5
LR = 1e-3
WEIGHT_ATOL = LR / 4
"""AdamW's first step moves a weight by lr * g / (|g| + eps): about lr wherever the gradient is above eps (1e-8),
so there the two backends' float32 gradients, which differ in their last bits, give the same weights to ~1e-7.
Where a gradient is itself rounding noise (near eps), that step is noise too: up to lr / 4 measured on one
element of 8192 (Llama's v_proj), the other weights within 2e-5. The gradients' norms agree to 1e-5 (relative)."""

FAMILIES = {
    "qwen2-tied": lambda root: build_tiny_model(root / "qwen2"),
    "llama-untied-gqa": lambda root: build_family_model(root / "llama", "llama", num_heads=4, num_kv_heads=2),
    "qwen3-qknorm": lambda root: build_family_model(root / "qwen3", "qwen3", head_dim=48),
}


@pytest.fixture(scope="module")
def process_group():
    """The one-rank process group megatron's parallel state is built on, torn down after this module."""
    import torch.distributed as dist

    yield
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_dir(request, tmp_path_factory):
    return FAMILIES[request.param](tmp_path_factory.mktemp(request.param))


def make_trainer(model_dir, backend: str, algorithm=None, device: str = "cpu", **trainer) -> Trainer:
    torch.manual_seed(0)
    trainer = {"lr": LR, "micro_batch_size": 4, "micro_batch_tokens": 0, **trainer}
    cfg = RunConfig(
        model=ModelConfig(path=str(model_dir)),
        algorithm=algorithm or AlgorithmConfig(),
        trainer=TrainerConfig(device=device, backend=backend, **trainer),
    )
    cfg.rollout.n = 4
    return Trainer(trainer_role(cfg))


def test_logprobs_and_one_update_match_fsdp2(family_dir, process_group):
    fsdp, mcore = make_trainer(family_dir, "fsdp2"), make_trainer(family_dir, "megatron")
    batch = ragged_batch()
    (mb,) = micro_batches(batch, 0, 1, 0, batch.size)
    with torch.no_grad():
        want_logp, want_entropy = fsdp._logprobs(fsdp.model, mb)
        logp, entropy = mcore._logprobs(mcore.model, mb)
    assert float((logp - want_logp).abs().max()) <= LOGPROB_ATOL
    assert float((entropy - want_entropy).abs().max()) <= LOGPROB_ATOL
    assert torch.equal(logp == 0, mb.batch.mask == 0)  # every real completion token scored, nothing else

    before = {name: tensor.clone() for name, tensor in fsdp.named_tensors()}
    want_metrics, metrics = fsdp.step(batch), mcore.step(batch)
    want, got = dict(fsdp.named_tensors()), dict(mcore.named_tensors())
    assert got.keys() == want.keys()
    assert max(float((want[k] - before[k]).abs().max()) for k in want) > 1e-4  # the update moved the weights
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, atol=WEIGHT_ATOL, rtol=0, msg=name)
    for key in ("loss", "grad_norm", "entropy", "clip_frac"):
        assert metrics[key] == pytest.approx(want_metrics[key], rel=1e-5, abs=1e-6), key


def test_sync_tensors_lie_in_the_weight_arena_and_cast_before_the_split(family_dir, process_group):
    """One rank: after ``WeightArena.adopt`` every tensor of a sync (the q, k and v split out of each fused q/k/v
    too) lies in the arena, with the values of the plain split; a cast to the engine's dtype gives each tensor
    cast (bitwise: casting before the split copies the same elements)."""
    from rlx.sync.arena import WeightArena

    mcore = make_trainer(family_dir, "megatron")
    plain = {name: tensor.clone() for name, tensor in mcore.model.named_tensors()}
    cast = dict(mcore.model.named_tensors(torch.bfloat16))
    assert all(torch.equal(cast[k], v.to(torch.bfloat16)) for k, v in plain.items())
    arena = WeightArena.adopt(mcore.model)
    try:
        synced = list(mcore.model.named_tensors())
        assert [arena.offset_of(t) for _, t in synced].count(None) == 0
        assert [name for name, _ in synced] == list(plain)
        assert all(torch.equal(t, plain[name]) for name, t in synced)
        assert any(name.endswith("k_proj.weight") for name, _ in synced)  # the split ran into the arena
    finally:
        arena.close()


@pytest.mark.gpu
def test_logprobs_and_one_update_match_fsdp2_on_cuda(tmp_path, process_group):
    """On CUDA: a lone rank's process group with NCCL for CUDA tensors, megatron-core's RNG tracker seeded, the
    core attention through scaled_dot_product_attention's CUDA kernels; the same logprobs, entropy and update as
    the FSDP2 backend (float32, cuBLAS and the attention kernels' own summation orders: 1e-4)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():  # the CPU tests' gloo group: this test makes its own
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
    model_dir = build_family_model(tmp_path / "llama", "llama", num_heads=4, num_kv_heads=2)
    fsdp, mcore = make_trainer(model_dir, "fsdp2", device="cuda"), make_trainer(model_dir, "megatron", device="cuda")
    assert "nccl" in str(dist.get_backend())
    batch = ragged_batch()
    (mb,) = micro_batches(batch, 0, 1, 0, batch.size)
    mb = mb.to(torch.device("cuda"))
    with torch.no_grad():
        want_logp, want_entropy = fsdp._logprobs(fsdp.model, mb)
        logp, entropy = mcore._logprobs(mcore.model, mb)
    assert logp.is_cuda and float((logp - want_logp).abs().max()) <= 1e-4
    assert float((entropy - want_entropy).abs().max()) <= 1e-4
    want_metrics, metrics = fsdp.step(batch), mcore.step(batch)
    want, got = dict(fsdp.named_tensors()), dict(mcore.named_tensors())
    for name, tensor in want.items():
        torch.testing.assert_close(got[name].cpu(), tensor.cpu(), atol=WEIGHT_ATOL, rtol=0, msg=name)
    assert metrics["loss"] == pytest.approx(want_metrics["loss"], rel=1e-4, abs=1e-6)


def test_sync_tensors_are_the_hf_weights_before_an_update(family_dir, process_group):
    mcore = make_trainer(family_dir, "megatron")
    original = load_file(str(family_dir / "model.safetensors"))
    synced = dict(mcore.named_tensors())
    tied = "lm_head.weight" not in original or mcore.model.spec.tie_word_embeddings
    assert synced.keys() == original.keys() - ({"lm_head.weight"} if tied else set())
    for name, tensor in synced.items():
        assert torch.equal(tensor, original[name]), name  # q/k/v and gate/up unfused exactly


def test_entropy_bonus_and_packed_plan_match_fsdp2(tmp_path, process_group):
    """The entropy's gradient through the vocabulary-parallel softmax, and a token-packed plan (this backend runs
    each micro-batch's rows padded: the same logprobs) on groups that share prompts."""
    model_dir = build_tiny_model(tmp_path / "m")
    algorithm = AlgorithmConfig(entropy_coef=0.05)
    fsdp = make_trainer(model_dir, "fsdp2", algorithm, micro_batch_tokens=64)
    mcore = make_trainer(model_dir, "megatron", algorithm, micro_batch_tokens=64)
    batch = grouped_batch()
    want_metrics, metrics = fsdp.step(batch), mcore.step(batch)
    want, got = dict(fsdp.named_tensors()), dict(mcore.named_tensors())
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, atol=WEIGHT_ATOL, rtol=0, msg=name)
    assert metrics["entropy"] == pytest.approx(want_metrics["entropy"], rel=1e-5)


def test_micro_batches_carry_each_prompt_and_no_column_past_their_longest_row(tmp_path, process_group):
    """A padded row costs its prompt and its completion: the plan counts both for every sample (no prompt shared),
    and each forward runs as wide as the micro-batch's longest sample, not the step batch's. On the Qwen 0.5B the
    shared-prompt plan, run padded at the step's width, had the trainer peak at 130.8 GB against FSDP2's 69.5."""
    budget = 40
    mcore = make_trainer(build_tiny_model(tmp_path / "m"), "megatron", micro_batch_tokens=budget)
    batch = grouped_batch()
    inputs = []
    hook = mcore.model.module.register_forward_pre_hook(lambda _, args: inputs.append(args[0].clone()))
    try:
        mcore.step(batch)
    finally:
        hook.remove()
    assert inputs
    for ids in inputs:  # the rows left-aligned: real tokens first, then the pad id (0 in this batch)
        real = (ids != 0).sum(dim=1)
        assert ids.shape[1] == int(real.max())  # as wide as its longest row
        assert int(real.sum()) <= budget or ids.shape[0] == 1, real.tolist()  # every prompt counted
    assert max(ids.shape[1] for ids in inputs) == int(batch.attention_mask.sum(dim=1).max())
    assert min(ids.shape[1] for ids in inputs) < batch.input_ids.shape[1]  # narrower than the step's batch


def _role(model_dir, **changes):
    cfg = RunConfig(
        model=changes.pop("model", ModelConfig(path=str(model_dir))),
        algorithm=changes.pop("algorithm", AlgorithmConfig()),
        trainer=TrainerConfig(device="cpu", backend=changes.pop("trainer_backend", "megatron"), **changes),
    )
    return trainer_role(cfg)


REFUSED = {
    "tp-heads": (
        {"num_ranks": 3, "megatron": MegatronConfig(tensor_parallel=3)},
        "tensor_parallel=3 does not divide the model's num_attention_heads=4",
    ),
    "tp-kv-heads": (
        {"num_ranks": 4, "megatron": MegatronConfig(tensor_parallel=4)},
        "tensor_parallel=4 does not divide the model's num_key_value_heads=2",
    ),
    "pp-layers": (
        {"num_ranks": 3, "megatron": MegatronConfig(pipeline_parallel=3)},
        "pipeline_parallel=3 does not divide the model's num_hidden_layers=2",
    ),
    "ranks": (
        {"num_ranks": 3, "megatron": MegatronConfig(tensor_parallel=2)},
        "trainer.num_ranks=3 is not a multiple of tensor x pipeline x context parallel",
    ),
    "pp": (
        {"num_ranks": 2, "megatron": MegatronConfig(pipeline_parallel=2)},
        "set trainer.megatron.pipeline_parallel=1",
    ),
    "cp": ({"num_ranks": 2, "megatron": MegatronConfig(context_parallel=2)}, "set trainer.megatron.context_parallel=1"),
    "dist-opt": ({"megatron": MegatronConfig(distributed_optimizer=True)}, "distributed_optimizer=false"),
    "lora": ({"model": "lora"}, "set model.lora.rank=0"),
    "critic": ({"algorithm": AlgorithmConfig(advantage="gae")}, "set algorithm.advantage=grpo"),
    "reference": ({"algorithm": AlgorithmConfig(kl_coef=0.1)}, "set algorithm.kl_coef=0"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_preflight_refuses_what_the_backend_cannot_split_or_run(case, tmp_path):
    from rlx.trainer.preflight import check_trainer

    model_dir = build_tiny_model(tmp_path / "m")  # 4 heads, 2 KV heads, 2 layers
    changes, message = REFUSED[case]
    changes = dict(changes)
    if changes.get("model") == "lora":
        changes["model"] = ModelConfig(path=str(model_dir), lora=LoraConfig(rank=4))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_trainer(_role(model_dir, **changes))


def test_preflight_accepts_a_layout_that_splits(tmp_path):
    from rlx.trainer.preflight import check_trainer

    model_dir = build_tiny_model(tmp_path / "m", vocab_size=101)  # padded to 102 rows under TP=2
    layout = check_trainer(_role(model_dir, num_ranks=4, megatron=MegatronConfig(tensor_parallel=2)))
    assert layout == "megatron-core GPTModel, local layer spec, TP=2 PP=1 CP=1 DP=2"


def test_doctor_names_the_spec_and_the_layout(tmp_path):
    from rlx.launch.doctor import role_checks

    cfg = RunConfig(
        model=ModelConfig(path=str(build_tiny_model(tmp_path / "m"))),
        trainer=TrainerConfig(device="cpu", backend="megatron", num_ranks=2),
    )
    (row,) = [check for check in role_checks(cfg) if check.what == "trainer"]
    assert re.fullmatch(r"megatron-core GPTModel, local layer spec, TP=1 PP=1 CP=1 DP=2 \(\d+\.\d s\)", row.found)


def test_config_refuses_an_unknown_backend_and_empty_sizes():
    with pytest.raises(ConfigError, match="trainer.backend='deepspeed' is not allowed"):
        TrainerConfig(backend="deepspeed")
    with pytest.raises(ConfigError, match="trainer.megatron.tensor_parallel=0 must be >= 1"):
        MegatronConfig(tensor_parallel=0)


def test_checkpoint_resumes_bit_exact_and_converts_to_hf(tmp_path, process_group):
    """A torch_dist checkpoint after one step; a new trainer loads it (weights, AdamW's moments and step, the
    schedule) and its next step is the one the first trainer takes; rlx convert-ckpt makes it a HF directory
    that holds the checkpoint's weights; the FSDP2 backend's --resume refuses it."""
    from rich.console import Console

    from rlx.convert.convert_ckpt import ConvertOptions, build_job
    from rlx.formats.checkpoint import verify_checkpoint
    from rlx.trainer.preflight import check_resume
    from rlx.trainer.ranks import RankGroup

    model_dir = build_tiny_model(tmp_path / "m", tie_word_embeddings=False)
    run = tmp_path / "run"
    first = make_trainer(model_dir, "megatron", output_dir=str(run))
    first.step(ragged_batch())
    RankGroup(first.cfg, first).checkpoint(1, {"step": 1, "data": {"seed": 0, "num_problems": 10}})
    (ckpt,) = (run / "checkpoints").iterdir()
    assert verify_checkpoint(ckpt)["backend"] == "megatron"
    saved = {name: tensor.clone() for name, tensor in first.named_tensors()}
    continued = first.step(grouped_batch())

    second = make_trainer(model_dir, "megatron", output_dir=str(run))
    assert RankGroup(second.cfg, second).load(1)["step"] == 1
    resumed = second.step(grouped_batch())
    want, got = dict(first.named_tensors()), dict(second.named_tensors())
    assert all(torch.equal(got[name], tensor) for name, tensor in want.items())
    assert resumed["loss"] == continued["loss"] and resumed["lr"] == continued["lr"]

    build_job(ckpt / "megatron", ConvertOptions()).run(tmp_path / "hf", Console(quiet=True), show_progress=False)
    converted = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert converted.keys() == saved.keys() and all(torch.equal(converted[k], v) for k, v in saved.items())
    # the run directory, as rlx convert-ckpt RUN_DIR and rlx eval --model RUN_DIR take it: its newest checkpoint
    build_job(run, ConvertOptions()).run(tmp_path / "hf_run", Console(quiet=True), show_progress=False)
    from_run = load_file(str(tmp_path / "hf_run" / "model.safetensors"))
    assert from_run.keys() == saved.keys() and all(torch.equal(from_run[k], v) for k, v in saved.items())
    with pytest.raises(ConvertError, match=r"already torch_dist .*convert it with --to hf"):
        build_job(ckpt, ConvertOptions(to="torch_dist"))

    assert check_resume(_role(model_dir), 0, 10, run, lambda _: None) == 1  # what --resume continues from
    fsdp_role = _role(model_dir, trainer_backend="fsdp2")
    with pytest.raises(ConfigError, match="trainer.backend=megatron wrote it and this run has trainer.backend=fsdp2"):
        check_resume(fsdp_role, 0, 10, run, lambda _: None)


def test_vocab_parallel_entropy_at_a_real_vocabulary_matches_float64():
    """The vocabulary-parallel kernel on one rank, at a real model's vocabulary with logits / 0.7 up to ~35, against
    the float64 log-softmax: entropy as lse - sum(p * z) / sum(p) lost 1.6e-5 there to cancellation, 1.2e-6 now."""
    from rlx.trainer.megatron.logprobs import VocabParallelLogprob

    torch.manual_seed(0)
    logits = torch.randn(300, 64) @ torch.randn(49152 + 64, 64).t()  # 64 padded columns past the vocabulary
    targets = torch.randint(0, 49152, (300,))
    logp, entropy = VocabParallelLogprob.apply(logits, targets, 0.7, 0, 49152, None)
    exact = (logits[:, :49152].double() / 0.7).log_softmax(-1)
    torch.testing.assert_close(logp.double(), exact.gather(-1, targets[:, None]).squeeze(-1), rtol=0, atol=2e-5)
    torch.testing.assert_close(entropy.double(), -(exact.exp() * exact).sum(-1), rtol=0, atol=5e-6)
