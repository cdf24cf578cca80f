"""The `rlx bench-sync` harness (runs in the bench process; its receivers and servers are children).

- ``sync``: the measurements: the memory-copy ceiling, the lock-step baseline and double buffering.
- ``lora``: adapter-only against merged LoRA sync of the same model.
- ``models``: the models it sends: Qwen2-shaped synthetic weights, or an HF directory's tensors.
"""
