"""Training side: model loading, FSDP2, logprobs, algorithms, optimizer, checkpoints."""
