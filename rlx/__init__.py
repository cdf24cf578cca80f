"""rlx: reinforcement-learning post-training for LLMs.

Each folder runs in one kind of process; imports run down this list (``tests/test_layers.py`` checks it):

- ``cli/``: one module per subcommand.
- ``bench/``: the bench-sync harness.
- ``launch/``: supervision only: starts and watches every process of a run, stops them, Ray, doctor.
- ``orchestrator/``: rank 0's RL loop: controller, fully_async, colocation turns, collectors, filters.
- ``trainer/``, ``rollout/``, ``agent/``, ``tasks/``: the process roles: trainer ranks, the rollout server,
  the tool and reward workers and environments, the datasets and rewards.
- ``sync/``, ``store/``, ``convert/``: weight transfer, the sample store and dumps, checkpoint conversion.
- ``trace/``: the tracer every process writes with, and the trace viewer.
- ground: ``rpc.py`` (ZeroMQ request/reply and its sockets), ``net.py`` (addresses), ``shm.py`` (/dev/shm
  segments), ``placement.py`` (devices and layouts), ``plugins.py``, ``formats/`` (chat templates,
  checkpoint layout, PEFT names) and ``config/`` (the schema, its checks, loading).
"""

__version__ = "0.1.0"
