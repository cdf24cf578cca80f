"""Supervision of `rlx train` (runs in the launcher process): start every child, watch it, stop it.

- ``launcher``: the embedded launcher (one host): checks, children, rank 0, teardown.
- ``ray_launcher`` / ``ray_actors`` / ``ray_probe``: ``launcher=ray``: the same run on a Ray cluster's nodes.
- ``preflight``: checks that run before any process starts; ``build_target``: where ``model.build_if_missing``
  may build (not at a typo of an existing model's path).
- ``processes``: child processes in their own process groups, logs streamed with a prefix.
- ``stops``: why a run stops early (a child's death, Ctrl-C, SIGTERM), delivered to the main thread.
- ``restarts``: restarting a launched rollout server that died.
- ``evaluation``: `rlx eval`: a checkpoint's servers, its held-out evaluation and the report.
- ``run_dir``: the run directory; ``leftovers``: /dev/shm files dead children left behind.
- ``display`` / ``closing``: the live console, and what a run says when it starts and ends.
- ``doctor``: `rlx doctor`: check a run's layout before starting it; ``tested_stack``: the GPU stack the GPU suite
  ran (constraints/gpu.txt) against a node's installed packages.
"""
