"""The sample store (tensors and metadata of a step's samples) and rollout dumps.

- ``base``: what a sample is, the producer/reader interface, ``create_store`` / ``open_reader``.
- ``shm``: the host's transport (one /dev/shm segment that every rank of the host maps).
- ``tcp``: the transport across hosts (a ZeroMQ server in the producer's process).
- ``dump``: ``rollout.dump_dir`` writes each step as safetensors + JSON with a checksummed manifest;
  ``rollout.reuse`` reads it back (checked by pre-flight before any process starts).
- ``preflight``: the dump check and the removal of killed runs' stores, run before a run starts.

Its users sit above it: the trainer ranks' data plane (``rlx.trainer.plane``), rank 0's step source
(``rlx.orchestrator.source``) and DAPO's filters (``rlx.orchestrator.filters``); the config sections
are in ``rlx.config.store``.
"""
