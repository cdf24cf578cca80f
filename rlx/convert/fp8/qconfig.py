"""The ``quantization_config`` an FP8 checkpoint's config.json carries, in the two formats vLLM reads.

block   -> vLLM's ``fp8`` method (as DeepSeek-V3 and Qwen3-FP8 ship): ``weight_block_size`` and the
           list of unquantized modules under both names readers use: ``ignored_layers`` (vLLM) and
           ``modules_to_not_convert`` (transformers).
channel / tensor -> compressed-tensors ``float-quantized`` with dynamic per-token FP8 activations
           (llm-compressor's FP8_DYNAMIC scheme for channel), unquantized modules under ``ignore``.
"""

from __future__ import annotations


def quantization_config(strategy: str, block: tuple[int, int], ignored: list[str]) -> dict:
    if strategy == "block":
        return {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": list(block),
            "ignored_layers": list(ignored),
            "modules_to_not_convert": list(ignored),
        }
    weights = {
        "num_bits": 8,
        "type": "float",
        "symmetric": True,
        "strategy": strategy,
        "dynamic": False,
        "group_size": None,
        "block_structure": None,
        "actorder": None,
        "observer": "minmax",
    }
    activations = {
        "num_bits": 8,
        "type": "float",
        "symmetric": True,
        "strategy": "token",
        "dynamic": True,
        "group_size": None,
        "block_structure": None,
        "actorder": None,
        "observer": None,
    }
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "kv_cache_scheme": None,
        "ignore": list(ignored),
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": activations,
                "output_activations": None,
                "format": "float-quantized",
            }
        },
    }


def scale_suffix(strategy: str) -> str:
    return ".weight_scale_inv" if strategy == "block" else ".weight_scale"
