"""``trainer.backend=megatron``: the policy on megatron-core's GPTModel, for the Trainer of ``rlx.trainer.trainer``.

- ``policy``: ``MegatronPolicy``, the methods the Trainer calls (logprobs, the guarded step, the sync's tensors).
- ``build``: this rank's GPTModel from the Hugging Face config (local or Transformer-Engine layer spec).
- ``weights``: Hugging Face safetensors into the rank's tensor-parallel cuts, and gathered back under HF names.
- ``logprobs``: completion logprobs and entropy with the vocabulary split over tensor-parallel ranks.
- ``parallel``: megatron's parallel state over the trainer's ranks; its forward on a CPU.
- ``preflight``: the layout against the model, and what this backend refuses.
"""
