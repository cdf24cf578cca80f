"""The sample store (data plane), rollout dumps and DAPO's sampling filters.

- ``base``: what a sample is, the producer/reader interface, ``create_store`` / ``open_reader``.
- ``shm``: the transport (one /dev/shm segment that every rank of the host maps).
- ``plane``: trainer ranks >= 2 pull their share of a step's rows (``trainer.data_plane=store``);
  used by ``rlx.orchestrator.controller`` (rank 0) and ``rlx.trainer.ranks`` (the others).
- ``dump``: ``rollout.dump_dir`` writes each step as safetensors + JSON with a checksummed manifest;
  ``rollout.reuse`` reads it back (checked by pre-flight before any process starts).
- ``filters``: DAPO's dynamic sampling, overlong filtering / soft punishment, a token cap per group;
  applied by ``rlx.orchestrator.collector``.
- ``config``: their config sections (imported by ``rlx.config.schema``; no torch).
"""
