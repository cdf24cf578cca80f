"""Built-in tools and how the config names tools.

``agent.tools`` lists tools; each entry is one of

- a built-in: ``calc`` (exact arithmetic on + - * / // % ** and parentheses) or ``python`` (runs
  the code in a sandboxed subprocess and returns its stdout);
- ``name=module:function`` or ``module:function`` (the tool is called ``function``): a function
  (argument dict) -> str;
- the name of an installed entry point in the ``rlx.tools`` group.

``resolve_tools`` turns the list into ``{name: "module:function"}`` and checks each reference in
the launcher, before any process starts (``rlx.launch.preflight``); the worker processes import
them again by name. Every tool function takes the call's argument dict and returns text.
``tool_schemas`` describes the tools to a chat model (OpenAI function schemas, what
``apply_chat_template(tools=...)`` takes): a built-in's own, a function's ``schema`` attribute (a dict
with ``description`` and JSON-schema ``parameters``), or else its docstring's first paragraph.

The ``python`` sandbox: ``python -I -S`` (isolated: no user site, no PYTHON* variables, no
site-packages), RLIMIT_AS and RLIMIT_CPU, a wall-time limit, an empty environment and a fresh
temporary working directory, and no network where ``unshare --net --map-root-user`` works (Linux
with unprivileged user namespaces); elsewhere the network stays reachable (best effort, as the
README says). It is not a security boundary against a determined attacker: run untrusted code in
a container.
"""

from __future__ import annotations

import ast
import functools
import operator
import shutil
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING

from rlx.config.errors import ConfigError

if TYPE_CHECKING:
    from rlx.config.agent import AgentConfig

GROUP = "rlx.tools"
BUILTIN = {"calc": "rlx.agent.tools:calc", "python": "rlx.agent.tools:python"}

BUILTIN_SCHEMAS = {
    "calc": {
        "description": "Evaluate an arithmetic expression exactly: numbers, + - * / // % ** and parentheses.",
        "parameters": {
            "type": "object",
            "required": ["expression"],
            "properties": {"expression": {"type": "string", "description": "the expression, e.g. 47*38"}},
        },
    },
    "python": {
        "description": "Run Python code in a sandbox and return what it prints.",
        "parameters": {
            "type": "object",
            "required": ["code"],
            "properties": {"code": {"type": "string", "description": "a Python program that prints its result"}},
        },
    },
}

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_EXPONENT = 64
PYTHON_TIMEOUT_S = 5.0
PYTHON_MEMORY_MB = 256


def calc(arguments: dict) -> str:
    """Evaluate ``arguments["expression"]``: numbers, + - * / // % **, parentheses; an int when exact."""
    expression = str(arguments.get("expression", ""))
    try:
        value = _evaluate(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        raise ValueError(f"cannot evaluate {expression!r}: {exc}") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _evaluate(node: ast.AST):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is above {MAX_EXPONENT}")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"only numbers, + - * / // % ** and parentheses are allowed, not {type(node).__name__}")


def python(arguments: dict) -> str:
    """Run ``arguments["code"]`` in a sandboxed ``python -I -S`` and return its stdout (and stderr on failure)."""
    code = str(arguments.get("code", arguments.get("expression", "")))
    command = [sys.executable, "-I", "-S", "-c", code]
    if network_isolation():
        command = ["unshare", "--net", "--map-root-user", *command]
    with tempfile.TemporaryDirectory(prefix="rlx-python-tool-") as workdir:
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                timeout=PYTHON_TIMEOUT_S,
                cwd=workdir,
                env={},
                stdin=subprocess.DEVNULL,
                preexec_fn=_limit_child,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the code ran past {PYTHON_TIMEOUT_S:g} s") from None
    out = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        return out + done.stderr.decode(errors="replace")[-2000:] + f"\n(exit code {done.returncode})"
    return out


def _limit_child() -> None:
    import resource

    limit = PYTHON_MEMORY_MB << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    cpu = int(PYTHON_TIMEOUT_S) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))


@functools.cache
def network_isolation() -> bool:
    """Whether ``unshare --net --map-root-user`` works here (checked once per process)."""
    unshare = shutil.which("unshare")
    return (
        bool(unshare)
        and subprocess.run([unshare, "--net", "--map-root-user", "true"], capture_output=True, check=False).returncode
        == 0
    )


def resolve_tools(entries: list[str], config_key: str = "agent.tools") -> dict[str, str]:
    """``{tool name: "module:function"}`` for ``entries``, each reference imported and checked here."""
    tools: dict[str, str] = {}
    for entry in entries:
        name, ref = _entry(entry, config_key)
        if name in tools:
            raise ConfigError(f"{config_key} names the tool {name!r} twice; give each tool one entry")
        check_ref(ref, config_key)
        tools[name] = ref
    return tools


def _entry(entry: str, config_key: str) -> tuple[str, str]:
    if entry in BUILTIN:
        return entry, BUILTIN[entry]
    name, eq, ref = entry.partition("=")
    if eq:
        return name.strip(), ref.strip()
    if ":" in entry:
        return entry.rsplit(":", 1)[1], entry
    from importlib.metadata import entry_points

    installed = {ep.name: ep.value for ep in entry_points(group=GROUP)}
    if entry in installed:
        return entry, installed[entry]
    known = ", ".join(sorted(set(BUILTIN) | set(installed)))
    raise ConfigError(
        f"{config_key} names {entry!r}, which is neither a built-in tool nor an installed one "
        f"(known: {known}); write 'module:function', 'name=module:function', or install a package "
        f"with an entry point in the {GROUP!r} group"
    )


def tool_schemas(tools: dict[str, str]) -> list[dict]:
    """An OpenAI function schema (``{"type": "function", "function": {name, description, parameters}}``) per tool."""
    from rlx.tasks.reward_fn import load_reward_fn

    schemas = []
    for name, ref in tools.items():
        if BUILTIN.get(name) == ref:
            schema = BUILTIN_SCHEMAS[name]
        else:
            fn = load_reward_fn(ref, "agent.tools")
            schema = getattr(fn, "schema", None)
            if not isinstance(schema, dict):
                doc = (fn.__doc__ or "").strip().split("\n\n")[0]
                schema = {"description": " ".join(doc.split()), "parameters": {"type": "object"}}
        schemas.append({"type": "function", "function": {"name": name, **schema}})
    return schemas


def check_ref(ref: str, what: str) -> None:
    """``ref`` is ``module:function`` naming an importable callable; else a ConfigError naming ``what``."""
    from rlx.tasks.reward_fn import load_reward_fn

    load_reward_fn(ref, what)


def is_multi_turn(agent: AgentConfig, task) -> bool:
    """Episodes are multi-turn when the task brings tools, ``agent.tools`` names some, or the task is openenv."""
    return bool(agent.tools or getattr(task, "tools", None) or getattr(task, "name", "") == "openenv")


def check_eval_k(eval_k: int, agent: AgentConfig, task) -> None:
    """pass@k and maj@k (``task.eval_k`` > 1) are for single-turn tasks: a multi-turn task is evaluated by its
    accuracy alone, so asking for them is refused rather than logging accuracy only."""
    if eval_k > 1 and is_multi_turn(agent, task):
        raise ConfigError(
            f"task.eval_k={eval_k}: pass@k and maj@k are for single-turn tasks; a multi-turn task "
            f"({getattr(task, 'name', '') or 'with tools'}) is evaluated by its accuracy alone; set task.eval_k=1"
        )


def tool_entries(agent: AgentConfig, task) -> list[str]:
    """``agent.tools``, or the task's own tools when it is empty."""
    return list(agent.tools or getattr(task, "tools", None) or [])


def check_agent(agent: AgentConfig, task_reward: str, task, eval_k: int = 1) -> None:
    """Pre-flight: every tool of a multi-turn run resolves to an importable function, and the reward does; a
    multi-turn run asks for no pass@k (``check_eval_k``)."""
    if not is_multi_turn(agent, task):
        return
    check_eval_k(eval_k, agent, task)
    resolve_tools(tool_entries(agent, task))
    reward_ref = getattr(task, "reward_ref", "")
    if reward_ref and not task_reward:
        check_ref(reward_ref, "the task's reward")
