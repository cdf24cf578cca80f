"""Prompts from chat messages: the tokenizer's chat template, or plain concatenation.

``ChatFormat`` turns OpenAI-style messages (``[{"role": ..., "content": ...}]``, with an optional
system prompt and tool schemas for ``apply_chat_template(tools=...)``) into prompt text with the
generation prompt appended. ``task.chat_template`` says which: ``on`` needs the tokenizer's
template (an error naming the fix when it has none), ``off`` concatenates the message contents as
they are (what a base model with a character tokenizer expects), ``auto`` uses the template when the
tokenizer has one. ``continuation`` renders only what a follow-up request adds to a conversation,
so a multi-turn episode stays token-in/token-out (the model's own tokens are never re-tokenized).
Tokenisation and generation are left to the caller.
"""

from __future__ import annotations

from typing import Any

from rlx.config.errors import ConfigError

CHAT_TEMPLATE_CHOICES = ("auto", "on", "off")
Messages = list[dict[str, Any]]


class ChatFormat:
    def __init__(
        self,
        tokenizer,
        mode: str = "auto",
        system_prompt: str = "",
        tools: list[dict] | None = None,
        where: str = "task.chat_template",
    ) -> None:
        if mode not in CHAT_TEMPLATE_CHOICES:
            raise ConfigError(f"{where}={mode!r} is not one of {', '.join(CHAT_TEMPLATE_CHOICES)}")
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if mode == "on" and not has_template:
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise ConfigError(
                f"{where}=on but the tokenizer of {name!r} has no chat template; set {where}=off "
                "(prompts are the message contents concatenated) or use a tokenizer that has one "
                "(chat_template in tokenizer_config.json or chat_template.jinja)"
            )
        self.tokenizer = tokenizer
        self.templated = mode == "on" or (mode == "auto" and has_template)
        self.system_prompt = system_prompt
        self.tools = tools or None

    @property
    def kind(self) -> str:
        """How prompts are made: "chat_template" or "plain" (contents concatenated)."""
        return "chat_template" if self.templated else "plain"

    def with_system(self, messages: Messages) -> Messages:
        if self.system_prompt and not (messages and messages[0].get("role") == "system"):
            return [{"role": "system", "content": self.system_prompt}, *messages]
        return list(messages)

    def render(self, messages: Messages, tools: list[dict] | None = None, generation_prompt: bool = True) -> str:
        """The prompt text of ``messages`` (system prompt prepended when it has none)."""
        messages = self.with_system(messages)
        if not self.templated:
            return "".join(_content_text(m) for m in messages)
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or self.tools, tokenize=False, add_generation_prompt=generation_prompt
        )

    def prompt_ids(self, messages: Messages, tools: list[dict] | None = None) -> list[int]:
        return self.tokenizer(self.render(messages, tools), add_special_tokens=False)["input_ids"]

    def continuation(
        self,
        earlier: Messages,
        messages: Messages,
        completion_text: str,
        completion_ids: list[int],
        tools: list[dict] | None = None,
    ) -> list[int] | None:
        """The token ids ``messages`` add after a conversation whose last request was ``earlier`` and
        whose answer the model sampled as ``completion_ids`` (decoded: ``completion_text``). None when
        ``messages`` is not ``earlier`` + that answer + more (the caller then renders it afresh)."""
        n = len(earlier)
        if (
            len(messages) <= n + 1
            or messages[:n] != earlier
            or messages[n].get("role") != "assistant"
            or _content_text(messages[n]) != completion_text
        ):
            return None
        head = self.render(earlier, tools)
        said = self.render(messages[: n + 1], tools, generation_prompt=False)
        whole = self.render(messages, tools)
        turn = said[len(head) :]
        if not (said.startswith(head) and whole.startswith(said) and turn.startswith(completion_text)):
            return None
        closing = turn[len(completion_text) :]  # what the template puts after the answer, e.g. "<|im_end|>\n"
        eos = self.tokenizer.eos_token
        if eos and completion_ids and completion_ids[-1] == self.tokenizer.eos_token_id and closing.startswith(eos):
            closing = closing[len(eos) :]  # the model already sampled it to stop
        return self.tokenizer(closing + whole[len(said) :], add_special_tokens=False)["input_ids"]


def _content_text(message: dict) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)
