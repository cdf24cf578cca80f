"""A rollout server process started while `rlx train` still checks the run: it imports what serving needs (the
server, the backend's engine: vLLM takes 10-25 s) beside the pre-flight, then waits for its command line.

    python -m rlx.cli.standby BACKEND          (the launcher starts it: ``rlx.launch.launcher.start_standbys``)

The launcher writes one line to its stdin, the JSON list of `rlx rollout-serve` arguments, and the process
becomes that server; an empty stdin (the launcher stopped: a pre-flight error, Ctrl-C) ends it having done
nothing but imports. It opens no socket, file or device before that line; its environment (the GPUs it sees)
was set when it started. Everything after the line is `rlx rollout-serve` unchanged. It lives beside the
subcommands because it is an entry point that becomes one; nothing imports it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time


def main() -> None:
    backend = sys.argv[1] if len(sys.argv) > 1 else ""
    started = time.perf_counter()
    import rlx.cli.rollout_serve  # noqa: F401 - typer, the config schema, the server
    import rlx.rollout.server  # noqa: F401
    from rlx.trace import startup

    with contextlib.suppress(ImportError):  # a missing engine is reported by the server itself, with its fix
        if backend == "vllm":
            import vllm.v1.engine.async_llm  # noqa: F401
        elif backend == "hf":
            import transformers  # noqa: F401
    imported = time.perf_counter()
    startup.mark("imported")
    line = sys.stdin.readline()
    if not line.strip():
        return
    startup.mark("command")
    print(
        f"rlx: standby: the {backend} server's imports took {imported - started:.1f} s before its command line "
        f"came (then {time.perf_counter() - imported:.1f} s of waiting)",
        flush=True,
    )
    from rlx.cli import app

    app(args=json.loads(line), prog_name="rlx")


if __name__ == "__main__":
    main()
