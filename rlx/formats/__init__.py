"""File formats more than one role reads or writes (ground layer: imports only ``rlx.config``).

- ``checkpoint``: an rlx trainer checkpoint's on-disk layout and its integrity check.
- ``peft``: PEFT's LoRA adapter format (key prefix, ``LoraConfig``).
- ``chat``: prompts from chat messages, through the tokenizer's chat template or plain.
- ``experts``: mixture-of-experts weights, fused (transformers) and one tensor per expert (checkpoints, vLLM).
- ``hf_dir``: a model directory's tokenizer files, and its JSON files read with a bound, as one object.
- ``hub``: Hugging Face Hub model ids (``ORG/NAME[@REVISION]``) resolved to snapshot directories of its cache.
"""
