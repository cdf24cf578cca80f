"""Tiny-model kit: small causal LMs with a character-level tokenizer.

``build_tiny_model(out_dir)`` writes a normal Hugging Face directory (config.json,
generation_config.json, tokenizer.json, tokenizer_config.json, model.safetensors) of a 2-layer
Qwen2-architecture model that transformers and vLLM both load in seconds. Tests and the quickstart
use it; nothing is downloaded. ``build_tiny_family(out_dir, family)`` writes the same kind of
directory for another architecture family (``FAMILIES``: the traits each one brings to the weight
sync, tied heads, q/k norms, rope scaling, soft-capping, offset norms, sliding windows), and of the
mixture-of-experts families ``MOE_FAMILIES`` (8 experts, 2 per token, every layer sparse). It leaves out
any pre-training: ``rlx.trainer.warmstart`` does that.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PretrainedConfig

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARACTERS = string.digits + "+-*/=" + string.ascii_letters + " \n.,?!:;()'\"#%$<>_"


def build_tokenizer(out_dir: str | Path):
    """A fast tokenizer that maps every character to one token (no merges) and back.

    The vocabulary is written in the byte-level alphabet (space is 'Ġ', newline 'Ċ') with a
    byte-level pre-tokenizer and decoder, the pipeline transformers forces on Qwen2 models, so
    transformers, vLLM and the raw tokenizers library all tokenize the same way.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_to_unicode = _bytes_to_unicode()
    chars = [byte_to_unicode[ord(c)] for c in CHARACTERS]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def tiny_qwen2_config(
    vocab_size: int,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = True,
):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size or 4 * hidden_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        torch_dtype="float32",
        use_sliding_window=False,
    )


def build_tiny_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    seed: int = 0,
    tie_word_embeddings: bool = True,
    dtype: str = "float32",
    intermediate_size: int | None = None,
    vocab_size: int | None = None,
) -> Path:
    """Build a randomly initialised tiny Qwen2 model + tokenizer in ``out_dir`` and return it."""
    from transformers import Qwen2ForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    vocab_size = vocab_size or _round_up(len(tokenizer), 64)
    config = tiny_qwen2_config(
        vocab_size,
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads,
        intermediate_size=intermediate_size,
        tie_word_embeddings=tie_word_embeddings,
    )
    return _write_model(out_dir, Qwen2ForCausalLM, config, seed, dtype)


def _write_model(out_dir: Path, make, config: PretrainedConfig, seed: int, dtype: str) -> Path:
    """``make(config)`` initialised under ``seed``, cast to ``dtype`` and saved into ``out_dir`` (beside the tokenizer
    already there) with the character tokenizer's generation config."""
    import torch
    from transformers import GenerationConfig

    torch.manual_seed(seed)
    model = make(config).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    _pin_dtype(out_dir / "config.json", dtype)
    return out_dir


QWEN2_RANDOM_SHAPES = {
    "qwen2_0p5b_random": dict(
        hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864, vocab_size=151936
    ),
    "qwen2_1p5b_random": dict(
        hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2, intermediate_size=8960, vocab_size=151936
    ),
    "qwen2_7b_random": dict(
        hidden_size=3584,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        intermediate_size=18944,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
}
"""The shapes of Qwen2.5-0.5B, -1.5B (both with tied embeddings) and -7B (its own head), for random-weight builds."""
QWEN2_0P5B_SHAPE = QWEN2_RANDOM_SHAPES["qwen2_0p5b_random"]


def build_qwen2_0p5b_random(out_dir: str | Path, seed: int = 0) -> Path:
    """A randomly initialised model of Qwen2.5-0.5B's shape (494M parameters, bfloat16) with the
    character tokenizer: for GPU throughput runs where a real checkpoint is not at hand."""
    return build_tiny_model(out_dir, seed=seed, dtype="bfloat16", **QWEN2_0P5B_SHAPE)


def build_qwen2_1p5b_random(out_dir: str | Path, seed: int = 0) -> Path:
    """As ``build_qwen2_0p5b_random``, Qwen2.5-1.5B's shape (1.54B parameters)."""
    return build_tiny_model(out_dir, seed=seed, dtype="bfloat16", **QWEN2_RANDOM_SHAPES["qwen2_1p5b_random"])


def build_qwen2_7b_random(out_dir: str | Path, seed: int = 0) -> Path:
    """As ``build_qwen2_0p5b_random``, Qwen2.5-7B's shape (7.62B parameters, an untied head: 15 GB to write)."""
    return build_tiny_model(out_dir, seed=seed, dtype="bfloat16", **QWEN2_RANDOM_SHAPES["qwen2_7b_random"])


def planned_parameter_count(
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    vocab_size: int | None = None,
    tie_word_embeddings: bool = True,
) -> int:
    """Parameters ``build_tiny_model`` with these arguments writes, counted on the meta device (nothing is
    allocated): `rlx doctor` sizes a model that `rlx train` has not built yet."""
    import torch
    from transformers import Qwen2ForCausalLM

    vocab_size = vocab_size or _round_up(len(SPECIAL_TOKENS) + len(CHARACTERS), 64)
    config = tiny_qwen2_config(
        vocab_size,
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads,
        intermediate_size=intermediate_size,
        tie_word_embeddings=tie_word_embeddings,
    )
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    return sum(p.numel() for p in model.parameters())


def _pin_dtype(config_path: Path, dtype: str) -> None:
    # Newer transformers write "dtype", older readers (vLLM's) look for "torch_dtype": keep both.
    config = json.loads(config_path.read_text())
    config["torch_dtype"] = dtype
    config["dtype"] = dtype
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


FAMILIES: dict[str, str] = {
    "qwen2": "Qwen2 (Qwen2.5-0.5B to 3B): tied embeddings, qkv bias, GQA",
    "qwen2_untied": "Qwen2 (Qwen2.5-7B, the Coder instruct models): an LM head of its own",
    "qwen3": "Qwen3 (0.6B to 4B): q/k RMS norms, no qkv bias, tied embeddings",
    "llama3": "Llama 3: untied head, llama3 rope scaling",
    "gemma2": "Gemma 2: tied, attention and final logit soft-capping, (1 + w) norms, alternate sliding windows",
    "gemma3": "Gemma 3 (text): tied, q/k norms, (1 + w) norms, local and global rope, sliding window",
    "mistral": "Mistral: untied head, GQA",
}
"""The architecture families ``build_tiny_family`` writes, with what each one brings to the weight sync."""


MOE_FAMILIES: dict[str, str] = {
    "qwen3_moe": "Qwen3-MoE (Qwen3-30B-A3B's layout): q/k norms, top-k softmax router renormalised over the chosen",
    "olmoe": "OLMoE: q/k norms over the whole projection, top-k softmax router not renormalised",
}
"""The mixture-of-experts families ``build_tiny_family`` writes: their experts are fused 3-D tensors in
transformers and one tensor per expert in the checkpoint and in vLLM (``rlx.formats.experts``)."""


def _family_shape(vocab_size: int, hidden_size: int, num_layers: int) -> dict:
    """The config fields every tiny family shares: 4 heads (2 KV heads), an MLP twice the width, the special ids."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def tiny_moe_config(family: str, vocab_size: int, hidden_size: int = 128, num_layers: int = 2, num_experts: int = 8):
    """A transformers config of the MoE ``family`` (``MOE_FAMILIES``): every layer sparse, ``num_experts``
    experts of width ``hidden_size // 2``, 2 routed per token, 4 heads (2 KV heads)."""
    import transformers

    shape = _family_shape(vocab_size, hidden_size, num_layers)
    shape.update(num_experts=num_experts, num_experts_per_tok=2, output_router_logits=False)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(
            **shape,
            head_dim=hidden_size // 4,
            moe_intermediate_size=hidden_size // 2,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            tie_word_embeddings=True,
            use_sliding_window=False,
        )
    if family == "olmoe":
        shape["intermediate_size"] = hidden_size // 2
        return transformers.OlmoeConfig(**shape, norm_topk_prob=False, tie_word_embeddings=False)
    raise ValueError(f"unknown MoE family {family!r}; pick one of {', '.join(MOE_FAMILIES)}")


QWEN3_MOE_1B_SHAPE = dict(
    hidden_size=1024, num_layers=16, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=512, vocab_size=151936
)
"""A Qwen3-MoE of about 1B parameters (Qwen3-30B-A3B's layout at a smaller width: 16 heads of 64, 4 KV heads)."""


def qwen3_moe_1b_config():
    import transformers

    shape = QWEN3_MOE_1B_SHAPE
    return transformers.Qwen3MoeConfig(
        vocab_size=shape["vocab_size"],
        hidden_size=shape["hidden_size"],
        num_hidden_layers=shape["num_layers"],
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=64,
        intermediate_size=4 * shape["hidden_size"],
        moe_intermediate_size=shape["moe_intermediate_size"],
        num_experts=shape["num_experts"],
        num_experts_per_tok=shape["num_experts_per_tok"],
        norm_topk_prob=True,
        decoder_sparse_step=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def build_qwen3_moe_1b_random(out_dir: str | Path, seed: int = 0) -> Path:
    """A randomly initialised Qwen3-MoE of ``QWEN3_MOE_1B_SHAPE`` (bfloat16) with the character tokenizer: the GPU
    run of routing replay, where no MoE checkpoint of that size is at hand."""
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out_dir)
    return _write_model(out_dir, AutoModelForCausalLM.from_config, qwen3_moe_1b_config(), seed, "bfloat16")


def tiny_family_config(family: str, vocab_size: int, hidden_size: int = 256, num_layers: int = 2):
    """A transformers config of ``family`` (``FAMILIES``, or ``MOE_FAMILIES`` at hidden size 128) at a tiny size:
    4 heads of 64 (2 KV heads; 64 is the smallest head size every GPU attention kernel of vLLM takes), the token
    ids of the character tokenizer."""
    import transformers

    if family in MOE_FAMILIES:
        return tiny_moe_config(family, vocab_size, num_layers=num_layers)
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; pick one of {', '.join([*FAMILIES, *MOE_FAMILIES])}")
    if family in ("qwen2", "qwen2_untied"):
        return tiny_qwen2_config(
            vocab_size,
            hidden_size,
            num_layers,
            intermediate_size=2 * hidden_size,
            tie_word_embeddings=family == "qwen2",
        )
    shape = _family_shape(vocab_size, hidden_size, num_layers)
    head_dim = hidden_size // 4
    if family == "qwen3":
        return transformers.Qwen3Config(**shape, head_dim=head_dim, tie_word_embeddings=True, use_sliding_window=False)
    if family == "llama3":
        scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
        return transformers.LlamaConfig(
            **shape,
            rope_scaling={**scaling, "original_max_position_embeddings": 256},
            tie_word_embeddings=False,
        )
    if family == "gemma2":
        return transformers.Gemma2Config(
            **shape, head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=8, tie_word_embeddings=True
        )
    if family == "gemma3":
        return transformers.Gemma3TextConfig(
            **shape,
            head_dim=head_dim,
            query_pre_attn_scalar=head_dim,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"][:num_layers],
            tie_word_embeddings=True,
        )
    return transformers.MistralConfig(**shape, sliding_window=None, tie_word_embeddings=False)


def build_tiny_family(out_dir: str | Path, family: str, *, seed: int = 0, dtype: str = "float32") -> Path:
    """A randomly initialised tiny model of ``family`` (``FAMILIES`` or ``MOE_FAMILIES``) with the character
    tokenizer in ``out_dir`` (a Hugging Face directory, as ``build_tiny_model`` writes)."""
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    config = tiny_family_config(family, _round_up(len(tokenizer), 64))
    return _write_model(out_dir, AutoModelForCausalLM.from_config, config, seed, dtype)
