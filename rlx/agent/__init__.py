"""Multi-turn episodes with tools: the policy and an environment take turns, as token ids.

- ``episode``: the ``Episode`` / ``Turn`` / ``ToolCall`` records (token-in/token-out) and their
  training row (loss mask 1 on policy tokens only).
- ``env``: the ``Environment`` interface (``reset`` / ``step``) and ``ToolEnv``, which parses tool
  calls and answers each with the tool's result as the next observation.
- ``toolcalls``: parsing Hermes/Qwen ``<tool_call>{json}</tool_call>`` and the plain ``<calc>...</calc>``.
- ``framing``: the first prompt's and each observation's token ids, as plain text or framed by the model's chat
  template (end of turn, tool messages, next assistant header), never re-tokenising earlier turns.
- ``openenv``: ``task.name=openenv``, episodes against an OpenEnv environment server (the optional extra
  ``rlx[openenv]``): turns become its actions, its observations the next turn's prompt, its reward the episode's.
- ``workers``: tools and rewards in worker processes, each call with a timeout and a memory limit.
- ``tools``: built-in tools (``calc``, ``python``) and resolving ``module:function`` / entry points.
The loop that runs an episode (``rlx.orchestrator.episode_loop``) and the collector of a step's episodes
(``rlx.orchestrator.episodes``) are rank 0's and live in ``rlx.orchestrator``.
"""
