"""Hugging Face <-> Megatron torch_dist with real megatron-core dist-checkpointing on the CPU.

Bit-exact round trips prove nothing is lost; loading the checkpoint into megatron-core's own
GPTModel and comparing its logits with transformers' proves the mapping (QKV interleave,
gate/up order, folded norms, vocabulary padding) is the one Megatron computes with.
"""

import contextlib
import json

import pytest
import torch
from convert_helpers import build_family_model, read_hf_weights, tree_digest, write_trainer_checkpoint
from rich.console import Console
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlx.convert.convert_ckpt import ConvertOptions, build_job
from rlx.convert.errors import ConvertError

CASES = {  # family, tied embeddings, vocabulary multiple (128 rows -> padded to 256 where 256)
    "qwen2-tied-padded": ("qwen2", True, 256),
    "llama-untied": ("llama", False, 128),
    "qwen3-qknorm-padded": ("qwen3", False, 96),
}


def _convert(src, dst, **options):
    return build_job(src, ConvertOptions(**options)).run(dst, Console(quiet=True), show_progress=False)


@pytest.fixture(scope="module", params=sorted(CASES))
def round_trip(request, tmp_path_factory):
    family, tied, multiple = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    hf_dir = build_family_model(
        root / "hf", family, tie_word_embeddings=tied, head_dim=48 if family == "qwen3" else None
    )
    before = tree_digest(hf_dir)
    _convert(hf_dir, root / "megatron", to="torch_dist", vocab_multiple=multiple, iteration=7)
    _convert(root / "megatron", root / "back", shard_bytes=200_000)
    assert tree_digest(hf_dir) == before
    return hf_dir, root / "megatron", root / "back", multiple


def test_hf_to_torch_dist_to_hf_is_bit_exact(round_trip):
    hf_dir, _, back, _ = round_trip
    original, returned = load_file(hf_dir / "model.safetensors"), read_hf_weights(back)
    assert original.keys() == returned.keys()
    for name, tensor in original.items():
        assert returned[name].dtype == tensor.dtype and torch.equal(returned[name], tensor), name
    config = json.loads((back / "config.json").read_text())
    assert config == json.loads((hf_dir / "config.json").read_text())


def test_megatron_layout_and_common_state_are_plain(round_trip):
    _, megatron, _, _ = round_trip
    assert (megatron / "latest_checkpointed_iteration.txt").read_text().strip() == "7"
    iter_dir = megatron / "iter_0000007"
    assert json.loads((iter_dir / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    common = torch.load(iter_dir / "common.pt", weights_only=True)
    assert common == {"checkpoint_version": 3.0, "iteration": 7}
    assert (megatron / "hf" / "config.json").is_file() and (megatron / "hf" / "tokenizer.json").is_file()


@contextlib.contextmanager
def _megatron_forward_on_cpu(monkeypatch):
    """megatron-core's forward assumes CUDA in two places (rotary cache, RNG tracker); point them at the CPU."""
    from megatron.core import tensor_parallel

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(tensor_parallel.get_cuda_rng_tracker(), "fork", lambda *a, **k: contextlib.nullcontext())
    yield


def test_megatron_gpt_model_loads_it_and_matches_hf_logits(round_trip, monkeypatch):
    from megatron.core import dist_checkpointing

    from rlx.convert.megatron import runtime
    from rlx.convert.megatron.spec import read_spec

    hf_dir, megatron, _, multiple = round_trip
    spec = read_spec(hf_dir / "config.json", multiple)
    ids = torch.tensor([[5, 17, 3, 40, 41, 12, 9, 33, 60, 2]])
    with runtime.single_process_group(), _megatron_forward_on_cpu(monkeypatch):
        model = runtime.build_gpt_model(spec, torch.float32, device="cpu")
        # As Megatron-LM's load_checkpoint does: the model's sharded state dict under "model".
        state = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(megatron / "iter_0000007"))
        model.load_state_dict(state["model"])
        model.eval()
        causal = torch.triu(torch.ones(1, 1, ids.shape[1], ids.shape[1]), diagonal=1).bool()
        with torch.no_grad():
            mcore = model(ids, torch.arange(ids.shape[1])[None], attention_mask=causal)
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(ids).logits
    assert mcore.shape[-1] == spec.padded_vocab_size
    torch.testing.assert_close(mcore[..., : spec.vocab_size], expected, atol=2e-5, rtol=1e-4)


def test_dry_run_plans_without_writing(tmp_path):
    from rlx.convert.destination import check_destination
    from rlx.convert.plan import render_plan

    hf_dir = build_family_model(tmp_path / "hf", "llama")
    job = build_job(hf_dir, ConvertOptions(to="torch_dist", vocab_multiple=256))
    plan = job.plan(check_destination(tmp_path / "out", hf_dir, False))
    console = Console(record=True, width=200)
    render_plan(plan, console)
    text = console.export_text()
    qkv = next(r for r in plan.rows if r.name == "decoder.layers.0.self_attention.linear_qkv.weight")
    assert qkv.sources == tuple(f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv") and qkv.shape == (256, 128)
    assert "decoder.layers.{i}.mlp.linear_fc1.weight" in text and "vocabulary padded from 128 to 256" in text
    assert next(r for r in plan.rows if r.name == "embedding.word_embeddings.weight").shape == (256, 128)
    assert not (tmp_path / "out").exists()


def test_trainer_checkpoint_goes_to_torch_dist_and_back(tmp_path):
    hf_dir = build_family_model(tmp_path / "hf", "qwen2", tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    write_trainer_checkpoint(tmp_path / "run", model, hf_dir, step=3)
    _convert(tmp_path / "run", tmp_path / "megatron", to="torch_dist")
    _convert(tmp_path / "megatron", tmp_path / "back")
    back = read_hf_weights(tmp_path / "back")
    original = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert back.keys() == original.keys() and all(torch.equal(back[k], original[k]) for k in back)


def test_crafted_metadata_pickle_is_refused(tmp_path):
    import pickle

    from rlx.convert.megatron.runtime import check_metadata_file

    class Payload:
        def __reduce__(self):
            return (print, ("this would run",))

    (tmp_path / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ConvertError, match="builtins.print is not part of checkpoint metadata"):
        check_metadata_file(tmp_path)


def test_wrong_hf_config_is_named(round_trip, tmp_path):
    hf_dir, megatron, _, _ = round_trip
    other = build_family_model(tmp_path / "other", "llama", num_layers=3)
    with pytest.raises(ConvertError, match="(stacks 2 layers but config.json says num_hidden_layers=3|has no tensor)"):
        build_job(megatron, ConvertOptions(hf_config=other))


def test_unsupported_family_is_refused(tmp_path):
    hf_dir = build_family_model(tmp_path / "hf", "llama")
    config = json.loads((hf_dir / "config.json").read_text())
    config["model_type"] = "gpt2"
    (hf_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConvertError, match="model_type 'gpt2' .* supported: llama, qwen2, qwen3"):
        build_job(hf_dir, ConvertOptions(to="torch_dist"))
