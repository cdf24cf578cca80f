"""Hugging Face <-> megatron-core torch_dist for Llama / Qwen2 / Qwen3 (see ``mapping``)."""
