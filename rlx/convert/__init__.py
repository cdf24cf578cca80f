"""Checkpoint conversion: trainer checkpoint -> Hugging Face, Hugging Face <-> Megatron
``torch_dist``, GGUF -> Hugging Face, and Hugging Face -> FP8.

Every conversion streams: tensors are read from the source with ``pread`` one tensor (or one
block of rows) at a time and written straight into the destination's safetensors shards, whose
headers are planned before any tensor is read. The destination is built in a temporary sibling
directory and renamed into place only when complete; the source is opened read-only.

Modules:
    safetensors_io     read and validate safetensors files / HF directories (no mmap, no pickle)
    safetensors_writer plan shards and write them tensor by tensor, with a byte-exact index
    destination        destination checks (--overwrite) and the atomic temporary directory
    trainer_ckpt       find and verify an rlx trainer checkpoint
    peft_export        a LoRA trainer checkpoint's adapter -> PEFT adapter directory
    hf_write           write an HF directory (weights + config + tokenizer) from a tensor stream
    plan               the --dry-run plan: tensors, bytes, mapping
    gguf_import        a GGUF file -> HF directory (transformers' GGUF reader, dequantized weights)
    megatron/          Llama / Qwen2 / Qwen3 <-> megatron-core GPTModel torch_dist
    fp8/               FP8 quantization (block / channel / tensor) in the formats vLLM loads

Left out: merging a LoRA adapter into the base weights, pickle-based ``.bin`` / ``.pt`` weights (refused), MoE models
for the
Megatron mapping.
"""
