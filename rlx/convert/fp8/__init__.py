"""Hugging Face checkpoint -> FP8 checkpoint that vLLM loads (``rlx fp8-convert``).

    quantize   the arithmetic: block / channel / tensor scales, dequantization, the e4m3 error bound
    policy     which tensors stay in high precision (norms, embeddings, lm_head, routers, vision, --skip)
    tp_check   whether each quantized layer splits into whole blocks under tensor parallelism
    qconfig    the ``quantization_config`` written into config.json
    job        the plan (output shards laid out from the source headers) and the run
    tasks      the units of work: a block of rows of one tensor, read, quantized, written in place
    parallel   the thread pool that runs the tasks, reading, quantizing and writing at once
    report     per-tensor dequantization error, kept tensors, bytes in and out
    dequantize FP8 directory -> high-precision directory (to compare models)

Left out: FP8 activations with static scales, KV-cache quantization, MoE expert fusion.
"""
