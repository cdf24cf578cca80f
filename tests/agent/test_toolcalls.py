"""Parsing tool calls, the calc tool and the python sandbox tool."""

from __future__ import annotations

import pytest

from rlx.agent.toolcalls import parse_tool_calls
from rlx.agent.tools import calc, network_isolation, python


def test_plain_calls_closed_or_cut_at_the_stop_string():
    assert [(c.name, c.arguments) for c in parse_tool_calls("<calc>3*47+5</calc>", "plain")] == [
        ("calc", {"expression": "3*47+5"})
    ]
    cut = parse_tool_calls("sure: <calc>12*12", "plain")  # the engine dropped the stop string '</calc>'
    assert [(c.name, c.arguments, c.error) for c in cut] == [("calc", {"expression": "12*12"}, "")]
    assert parse_tool_calls("144", "plain") == []


def test_hermes_calls_with_object_or_string_arguments_and_malformed_ones():
    calls = parse_tool_calls(
        '<tool_call>{"name": "calc", "arguments": {"expression": "1+1"}}</tool_call>'
        '<tool_call>{"name": "calc", "arguments": "{\\"expression\\": \\"2\\"}"}</tool_call>',
        "hermes",
    )
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("calc", {"expression": "1+1"}, ""),
        ("calc", {"expression": "2"}, ""),
    ]
    [no_name] = parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>', "hermes")
    assert no_name.error.startswith("malformed tool call")
    [bad_args] = parse_tool_calls('<tool_call>{"name": "calc", "arguments": [1]}</tool_call>', "hermes")
    assert "arguments must be a JSON object" in bad_args.error
    [cut] = parse_tool_calls('<tool_call>{"name": "calc", "arguments": {"expression": "3', "hermes")
    assert cut.error.startswith("malformed tool call: invalid JSON")


def test_hermes_lists_of_calls_and_parameters_as_written_by_chat_models():
    listed = parse_tool_calls(
        'Let me compute.\n<tool_call>[{"name": "calc", "arguments": {"expression": "47*38"}}, '
        '{"name": "python", "parameters": {"code": "print(1)"}}]</tool_call>',
        "hermes",
    )
    assert [(c.name, c.arguments, c.error) for c in listed] == [
        ("calc", {"expression": "47*38"}, ""),
        ("python", {"code": "print(1)"}, ""),
    ]
    [empty] = parse_tool_calls("<tool_call>[]</tool_call>", "hermes")
    assert empty.error.startswith("malformed tool call")


def test_calc_is_exact_and_refuses_anything_but_arithmetic():
    assert calc({"expression": "47*38"}) == "1786" and calc({"expression": "(7+1)/2"}) == "4"
    for bad in ("__import__('os')", "2**100000", "1/0", "x+1"):
        with pytest.raises(ValueError, match="cannot evaluate"):
            calc({"expression": bad})


def test_python_tool_runs_isolated_code_with_limits(monkeypatch):
    monkeypatch.setattr("rlx.agent.tools.PYTHON_TIMEOUT_S", 1.0)
    assert python({"code": "print(6*7)"}) == "42\n"
    env = python({"code": "import os, sys; print(len(os.environ), sys.flags.isolated, sys.flags.no_site)"})
    assert env.split()[1:] == ["1", "1"]
    with pytest.raises(TimeoutError):
        python({"code": "while True: pass"})
    assert "MemoryError" in python({"code": "x = bytearray(1 << 30)"})
    if network_isolation():
        out = python({"code": "import socket; socket.create_connection(('10.255.255.1', 80), timeout=2)"})
        assert "Network is unreachable" in out


def test_pre_flight_refuses_pass_at_k_for_a_multi_turn_task_and_names_the_fix():
    """task.eval_k > 1 on a task with tools: `rlx train`'s pre-flight (and `rlx eval`) refuse it, since a multi-turn
    task is evaluated by its accuracy alone; a single-turn task keeps its pass@k."""
    from rlx.agent.tools import check_agent
    from rlx.config import ConfigError, load_config
    from rlx.tasks import build_task

    cfg = load_config("configs/quickstart_tools.yaml", ["task.eval_k=4"])
    task = build_task(cfg.task)
    with pytest.raises(ConfigError, match=r"task.eval_k=4: pass@k and maj@k are for single-turn tasks.*task.eval_k=1"):
        check_agent(cfg.agent, cfg.task.reward, task, cfg.task.eval_k)
    check_agent(cfg.agent, cfg.task.reward, task, 1)
    single = load_config("configs/quickstart.yaml", ["task.eval_k=4"])
    check_agent(single.agent, single.task.reward, build_task(single.task), single.task.eval_k)
