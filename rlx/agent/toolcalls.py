"""Parse the tool calls in one turn of policy text, in two formats.

- ``hermes``: Hermes/Qwen style, ``<tool_call>{"name": "calc", "arguments": {"expression": "3*4"}}</tool_call>``
  (JSON inside the tags; several calls per turn allowed). A JSON list of such objects inside one pair of
  tags is several calls (SmolLM2 writes its calls so), and ``parameters`` is taken for ``arguments``
  (Llama 3.x writes that). Text around the tags (the model's reasoning) is ignored.
- ``plain``: for tiny character-level models, ``<calc>3*47+5</calc>`` (``<NAME>ARGUMENT</NAME>``), the
  argument passed as ``{"expression": ...}``. Generation usually stops at the closing tag (a stop
  string), and some engines drop the stop string from the text, so an unclosed call at the very end
  of the text counts as closed.

A malformed call is returned as a ``ToolCall`` with ``error`` set, never raised: the environment
turns it into an observation saying so. Text without any call gives an empty list.
"""

from __future__ import annotations

import json
import re

from rlx.agent.episode import ToolCall

FORMATS = ("plain", "hermes")
_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_PLAIN = re.compile(r"<([A-Za-z_][A-Za-z0-9_]*)>(.*?)(?:</\1>|$)", re.DOTALL)


def parse_tool_calls(text: str, fmt: str) -> list[ToolCall]:
    if fmt == "hermes":
        return [call for body in _HERMES.findall(text) for call in _hermes(body)]
    if fmt == "plain":
        return [ToolCall(name=name, arguments={"expression": body.strip()}) for name, body in _PLAIN.findall(text)]
    raise ValueError(f"tool call format {fmt!r} is unknown; set agent.tool_format to one of {', '.join(FORMATS)}")


def _hermes(body: str) -> list[ToolCall]:
    try:
        calls = json.loads(body)
    except json.JSONDecodeError as exc:
        return [ToolCall(name="", arguments={}, error=f"malformed tool call: invalid JSON ({exc.msg} at {exc.pos})")]
    if isinstance(calls, list) and calls:
        return [_hermes_call(call) for call in calls]
    return [_hermes_call(calls)]


def _hermes_call(call) -> ToolCall:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCall(name="", arguments={}, error='malformed tool call: expected {"name": ..., "arguments": {...}}')
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):  # some chat templates send the arguments JSON-encoded
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = None
    if not isinstance(arguments, dict):
        return ToolCall(name=call["name"], arguments={}, error="malformed tool call: arguments must be a JSON object")
    return ToolCall(name=call["name"], arguments=arguments)
