"""The rollout server process (`rlx rollout-serve`), and the API the other roles reach it through.

- ``server``: one ZeroMQ ROUTER in front of one backend; generate, pause / resume, weight updates.
- ``protocol``: the wire messages (msgspec, versioned); imported by every client.
- ``client``: the asyncio client of one or many servers (rank 0, a teacher, a judge, bench-sync).
- ``openai_http``: the OpenAI-compatible HTTP endpoint that records episodes for training.
- ``priority``: a server that yields the CPU to the trainer beside it.
- ``backends/``: the engines behind the server: vLLM (with its worker extension and LoRA loader) and hf.
- ``preflight``: what a server's inputs must satisfy before one starts.
"""
