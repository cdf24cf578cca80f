"""FP8 quantization: the e4m3 error bound, finite scales, vLLM's formats, skips, TP checks, logits."""

import json

import pytest
import torch
from convert_helpers import build_family_model, read_hf_weights, tree_digest
from rich.console import Console
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from rlx.convert.convert_ckpt import ConvertOptions, build_job
from rlx.convert.errors import ConvertError
from rlx.convert.fp8 import quantize as fq
from rlx.convert.fp8.dequantize import dequantize_dir
from rlx.convert.fp8.job import Fp8Options, fp8_job

BLOCK = (128, 128)


def _weights(rows=300, cols=200):
    torch.manual_seed(0)
    w = torch.randn(rows, cols) * 0.02
    w[5, 7] = 3.0  # an outlier: its block gets a large scale, the others must not care
    w[128:256, 128:] = 0.0  # an all-zero block
    w[260:, :] *= 1e-6  # tiny values that land in e4m3 subnormals
    return w


@pytest.mark.parametrize("strategy", fq.STRATEGIES)
def test_dequantization_error_within_the_e4m3_bound(strategy):
    w = _weights()
    amax = float(w.abs().max()) if strategy == "tensor" else None
    result = fq.quantize(w, strategy, BLOCK, amax)
    q, scale = result.q, result.scale
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape and scale.dtype == torch.float32
    assert tuple(scale.shape) == fq.scale_shape(strategy, tuple(w.shape), BLOCK)
    assert torch.isfinite(scale).all() and (scale > 0).all()
    deq = fq.dequantize(q, scale, strategy, BLOCK)
    torch.testing.assert_close(deq, q.float() * fq.expand_scale(scale, strategy, tuple(w.shape), BLOCK))
    bound = fq.error_bound(w, fq.expand_scale(scale, strategy, tuple(w.shape), BLOCK))
    excess = (deq - w).abs() - bound * (1 + 1e-6)
    assert excess.max() <= 0, f"{int((excess > 0).sum())} elements beyond the e4m3 bound"
    assert ((deq - w).abs().max() / w.abs().max()) <= 2.0**-4
    # The error the report carries is the error of the dequantized weights.
    assert result.max_abs_err == pytest.approx(float((deq - w).abs().max()), rel=1e-4)
    assert result.sum_abs_err == pytest.approx(float((deq - w).abs().double().sum()), rel=1e-3)


def test_wide_block_rows_are_quantized_in_slabs_to_the_same_bytes(monkeypatch):
    w = _weights(300, 1000)
    whole = fq.quantize(w, "block", BLOCK)
    monkeypatch.setattr(fq, "SLAB_BYTES", 64 << 10)  # 128-column slabs, the last one padded
    slabs = fq.quantize(w, "block", BLOCK)
    assert torch.equal(slabs.q.view(torch.uint8), whole.q.view(torch.uint8)) and torch.equal(slabs.scale, whole.scale)
    assert slabs.max_abs_err == whole.max_abs_err and slabs.amax == whole.amax
    assert slabs.sum_abs_err == pytest.approx(whole.sum_abs_err, rel=1e-5)


def test_block_scale_shape_rounds_up_and_zero_blocks_stay_zero():
    w = _weights()
    result = fq.quantize(w, "block", BLOCK)
    q, scale = result.q, result.scale
    assert scale.shape == (3, 2)
    assert scale[1, 1] == fq.MIN_AMAX / fq.FP8_MAX
    zero_block = fq.dequantize(q, scale, "block", BLOCK)[128:256, 128:]
    assert torch.equal(zero_block, torch.zeros_like(zero_block))
    assert not torch.isnan(q.float()).any()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    return build_family_model(root / "llama", "llama", hidden_size=256, dtype="bfloat16")


def _with_extra_tensors(src, dst):
    """A copy of ``src`` in two shards plus a MoE router, a vision tower tensor and a 2-D norm-free bias."""
    build_job(src, ConvertOptions(to="hf", shard_bytes=1_500_000)).run(dst, Console(quiet=True), show_progress=False)
    extra = {
        "model.layers.0.mlp.gate.weight": torch.randn(8, 256, dtype=torch.bfloat16),
        "model.visual.blocks.0.attn.qkv.weight": torch.randn(384, 128, dtype=torch.bfloat16),
    }
    save_file(extra, dst / "extra.safetensors", metadata={"format": "pt"})
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    index["weight_map"].update({name: "extra.safetensors" for name in extra})
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst


def test_block_conversion_writes_what_vllm_reads(llama, tmp_path):
    src = _with_extra_tensors(llama, tmp_path / "src")
    before = tree_digest(src)
    job = fp8_job(src, Fp8Options(skip=["model.layers.1.mlp.down_proj"], workers=2))
    report = job.run(tmp_path / "fp8", Console(quiet=True), show_progress=False)
    out = tmp_path / "fp8"
    assert tree_digest(src) == before
    weights, original = read_hf_weights(out), read_hf_weights(src)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in weights.values())
    assert sorted(set(index["weight_map"].values())) == sorted(
        set(json.loads((src / "model.safetensors.index.json").read_text())["weight_map"].values())
    )
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    scale = weights["model.layers.0.self_attn.q_proj.weight_scale_inv"]
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (2, 2)
    kept = {
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.norm.weight",
        "model.layers.0.mlp.gate.weight",
        "model.visual.blocks.0.attn.qkv.weight",
        "model.layers.1.mlp.down_proj.weight",
    }
    for name in kept:
        assert torch.equal(weights[name], original[name]), name
    reasons = dict(report.kept)
    assert reasons["model.layers.0.mlp.gate.weight"] == "MoE router / gate"
    assert reasons["model.visual.blocks.0.attn.qkv.weight"] == "vision tower"
    assert reasons["model.layers.1.mlp.down_proj.weight"] == "--skip model.layers.1.mlp.down_proj"
    qconfig = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qconfig["quant_method"] == "fp8" and qconfig["fmt"] == "e4m3"
    assert qconfig["activation_scheme"] == "dynamic" and qconfig["weight_block_size"] == [128, 128]
    assert qconfig["ignored_layers"] == qconfig["modules_to_not_convert"]
    assert {
        "lm_head",
        "model.embed_tokens",
        "model.layers.0.mlp.gate",
        "model.visual.blocks.0.attn.qkv",
        "model.layers.1.mlp.down_proj",
    } <= set(qconfig["ignored_layers"])
    assert len(report.quantized) == 13 and all(s.max_rel <= 2.0**-4 for s in report.quantized)
    assert report.bytes_out < report.bytes_in


@pytest.mark.parametrize("strategy,scale_shape", [("channel", (256, 1)), ("tensor", (1,))])
def test_channel_and_tensor_use_compressed_tensors(llama, tmp_path, strategy, scale_shape):
    fp8_job(llama, Fp8Options(strategy=strategy)).run(tmp_path / "out", Console(quiet=True), show_progress=False)
    weights = load_file(tmp_path / "out" / "model.safetensors")
    assert weights["model.layers.0.self_attn.o_proj.weight_scale"].shape == scale_shape
    qconfig = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert qconfig["quant_method"] == "compressed-tensors" and "lm_head" in qconfig["ignore"]
    assert qconfig["config_groups"]["group_0"]["weights"]["strategy"] == strategy


def test_fp8_model_dequantized_gives_logits_close_to_the_original(llama, tmp_path):
    fp8_job(llama, Fp8Options()).run(tmp_path / "fp8", Console(quiet=True), show_progress=False)
    dequantize_dir(tmp_path / "fp8", tmp_path / "deq")
    ids = torch.tensor([[5, 17, 3, 40, 41, 12, 9, 33, 60, 2, 44, 45]])
    with torch.no_grad():
        original = AutoModelForCausalLM.from_pretrained(llama, dtype=torch.float32)(ids).logits
        restored = AutoModelForCausalLM.from_pretrained(tmp_path / "deq", dtype=torch.float32)(ids).logits
        other_seed = build_family_model(tmp_path / "other", "llama", hidden_size=256, dtype="bfloat16", seed=1)
        unrelated = AutoModelForCausalLM.from_pretrained(other_seed, dtype=torch.float32)(ids).logits
    error = (restored - original).norm() / original.norm()
    assert error < 0.1, f"relative logit error {error:.3f}"
    assert error < 0.2 * (unrelated - original).norm() / original.norm()


def test_fp8_input_is_refused(llama, tmp_path):
    fp8_job(llama, Fp8Options()).run(tmp_path / "fp8", Console(quiet=True), show_progress=False)
    with pytest.raises(ConvertError, match="already quantized .* convert from the bf16"):
        fp8_job(tmp_path / "fp8", Fp8Options())
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    del config["quantization_config"]
    (tmp_path / "fp8" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConvertError, match="already holds FP8 tensors"):
        fp8_job(tmp_path / "fp8", Fp8Options())


def test_tp_check_names_every_tensor_vllm_would_refuse(llama, tiny_model_dir):
    with pytest.raises(ConvertError) as small:
        fp8_job(tiny_model_dir, Fp8Options())
    assert "model.layers.0.self_attn.k_proj.weight: 64 output rows per rank" in str(small.value)
    assert "model.layers.1.self_attn.k_proj.weight" in str(small.value)
    assert "--block-size 64 64 (fits every tensor here)" in str(small.value)  # the kit's 128-wide model
    assert fp8_job(tiny_model_dir, Fp8Options(block=(64, 64))).weights
    with pytest.raises(ConvertError) as tp4:
        fp8_job(llama, Fp8Options(tp=4))
    message = str(tp4.value)
    assert "--tp 4" in message and "model.layers.0.self_attn.o_proj.weight: 64 input columns per rank" in message
    assert "model.layers.1.self_attn.v_proj.weight: 64 output rows per rank" in message
    assert "--block-size 64 64 (fits every tensor here)" in message
    assert fp8_job(llama, Fp8Options(tp=4, block=(64, 64))).weights
    assert fp8_job(llama, Fp8Options(tp=2, block=(32, 32))).weights


def test_fp8_magnitude_decodes_every_code():
    q = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    finite = ~torch.isnan(q.float())
    assert torch.equal(fq.fp8_magnitude(q)[finite], q.float().abs()[finite])


@pytest.mark.parametrize("strategy", fq.STRATEGIES)
def test_many_small_tasks_write_what_whole_tensors_quantize_to(llama, tmp_path, monkeypatch, strategy):
    from rlx.convert.fp8 import tasks

    monkeypatch.setattr(tasks, "TASK_BYTES", 32 << 10)  # 128-row blocks, 32-row channel tasks: several per tensor
    job = fp8_job(llama, Fp8Options(strategy=strategy, workers=3))
    report = job.run(tmp_path / "out", Console(quiet=True), show_progress=False)
    out, src = load_file(tmp_path / "out" / "model.safetensors"), load_file(llama / "model.safetensors")
    suffix = ".weight_scale_inv" if strategy == "block" else ".weight_scale"
    stats = {s.name: s for s in report.quantized}
    assert len(stats) == 14
    for name, w in src.items():
        if name not in stats:
            assert torch.equal(out[name], w), name
            continue
        whole = fq.quantize(w.float(), strategy, BLOCK, float(w.float().abs().max()) if strategy == "tensor" else None)
        assert torch.equal(out[name].view(torch.uint8), whole.q.view(torch.uint8)), name
        assert torch.equal(out[name[: -len(".weight")] + suffix], whole.scale), name
        assert stats[name].max_abs_err == whole.max_abs_err and stats[name].numel == w.numel()
        assert stats[name].sum_abs_err == pytest.approx(whole.sum_abs_err, rel=1e-5)


def test_a_failing_task_leaves_no_destination(llama, tmp_path, monkeypatch):
    from rlx.convert.fp8 import tasks

    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return original(*args, **kwargs)

    original = fq.quantize
    monkeypatch.setattr(tasks.fq, "quantize", failing)
    with pytest.raises(OSError, match="No space left"):
        fp8_job(llama, Fp8Options(workers=2)).run(tmp_path / "out", Console(quiet=True), show_progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_shard_missing_a_part_is_not_closed_as_complete(tmp_path):
    from rlx.convert.safetensors_writer import OutTensor, Shard, ShardFile

    shard = Shard(
        "model.safetensors", [OutTensor("a", torch.float32, (4, 2), None), OutTensor("b", torch.bfloat16, (3,), None)]
    )
    out = ShardFile(tmp_path / shard.file_name, shard)
    out.write("b", 0, torch.ones(3, dtype=torch.bfloat16))
    out.write("a", 8 * 4 // 2, torch.full((2, 2), 2.0))  # rows 2 and 3 first: parts go in any order
    with pytest.raises(RuntimeError, match="a: 16 of 32 bytes"):
        out.close()
    out = ShardFile(tmp_path / shard.file_name, shard)
    out.write("a", 16, torch.full((2, 2), 2.0))
    out.write("a", 0, torch.ones(2, 2))
    out.write("b", 0, torch.ones(3, dtype=torch.bfloat16))
    out.close()
    written = load_file(tmp_path / shard.file_name)
    assert torch.equal(written["a"], torch.tensor([[1.0, 1.0], [1.0, 1.0], [2.0, 2.0], [2.0, 2.0]]))
    assert torch.equal(written["b"], torch.ones(3, dtype=torch.bfloat16))


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"model_type": "llama", ', "config.json is not valid JSON (Expecting property name"),
        ("[1, 2]", "config.json holds a JSON list, not a model config"),
        ('{"num_key_value_heads": "two"}', "config.json: num_key_value_heads='two' is not a positive integer"),
        (None, "src has no config.json; pass the Hugging Face directory"),
    ],
)
def test_broken_config_is_one_line_and_keeps_an_existing_output(llama, tmp_path, content, message):
    import shutil

    from typer.testing import CliRunner

    from rlx.cli import app

    src = tmp_path / "src"
    shutil.copytree(llama, src)
    if content is None:
        (src / "config.json").unlink()
    else:
        (src / "config.json").write_text(content)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("user data")
    for args in ([], ["--overwrite"]):
        result = CliRunner().invoke(app, ["fp8-convert", str(src), str(tmp_path / "out"), *args])
        text = " ".join(result.output.split())
        assert result.exit_code == 2 and message in text and str(src) in text, text
        assert "Traceback" not in text and isinstance(result.exception, SystemExit)
    assert (tmp_path / "out" / "keep.txt").read_text() == "user data"
