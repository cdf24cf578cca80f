"""A generative judge: the step's samples go to a judge model served by `rlx rollout-serve` (the user starts
it, as for a served distillation teacher) in ONE Generate request, greedy; the first number (or yes/no) of
each reply is the score.

A reply with no score is scored 0 and counted in ``judge_unparsed``; it never fails the step. A judge that is
down, refuses the request or passes ``task.reward_model.timeout_s`` fails the step with ``RewardModelError``
naming its address: training on silently replaced rewards would change the objective.
"""

from __future__ import annotations

import asyncio
import re

from rlx.tasks.reward_models import RewardModelError, Scored

YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


class Judge:
    def __init__(self, rm, token: str = "") -> None:
        self.rm, self.token = rm, token
        self.pattern = re.compile(rm.score_pattern)

    def prompts(self, questions: list[str], responses: list[str], answers: list[str]) -> list[str]:
        return [
            self.rm.template.format(question=q, response=r, answer=a)
            for q, r, a in zip(questions, responses, answers, strict=True)
        ]

    def parse(self, reply: str) -> float | None:
        """The score in one judge reply, or None when it has none."""
        if self.rm.parse == "yes_no":
            found = YES_NO.search(reply)
            return None if found is None else float(found.group(1).lower() == "yes")
        found = self.pattern.search(reply)
        if found is None:
            return None
        try:
            return float(found.group(1) if found.groups() else found.group(0))
        except (TypeError, ValueError):
            return None

    async def score(self, questions: list[str], responses: list[str], answers: list[str]) -> Scored:
        replies = await self.generate(self.prompts(questions, responses, answers))
        parsed = [self.parse(reply) for reply in replies]
        unparsed = sum(s is None for s in parsed)
        return Scored([0.0 if s is None else s for s in parsed], {"judge_unparsed": float(unparsed)})

    async def generate(self, prompts: list[str]) -> list[str]:
        """Greedy replies to ``prompts``, all in one request to the judge server."""
        from rlx.rollout.client import RolloutClient, RolloutServerError
        from rlx.rollout.protocol import Generate, SamplingSpec

        if not prompts:
            return []
        greedy = SamplingSpec(n=1, temperature=0.0, max_tokens=self.rm.max_tokens)
        client = RolloutClient([self.rm.server], self.token, timeout_s=self.rm.timeout_s)
        try:
            reply = await client.call(0, Generate(prompts=prompts, sampling=greedy), timeout_s=self.rm.timeout_s)
        except RolloutServerError as exc:
            raise RewardModelError(
                f"the judge at {self.rm.server} did not score this step's {len(prompts)} samples: "
                f"{exc}; check that `rlx rollout-serve` of the judge runs at "
                "task.reward_model.server, or raise task.reward_model.timeout_s"
            ) from None
        finally:
            client.close()
        return [result.samples[0].text for result in reply.results]


def check_judge_up(rm, token: str = "", timeout_s: float = 10.0) -> None:
    """Pre-flight: the judge server answers a health check."""
    from rlx.config.errors import ConfigError
    from rlx.rollout.client import RolloutClient, RolloutServerError

    async def health() -> None:
        client = RolloutClient([rm.server], token, timeout_s=timeout_s)
        try:
            await client.health(timeout_s=timeout_s)
        finally:
            client.close()

    try:
        asyncio.run(health())
    except RolloutServerError as exc:
        raise ConfigError(
            f"task.reward_model.server={rm.server!r}: the judge did not answer a health check ({exc}); "
            "start it first with `rlx rollout-serve JUDGE.yaml --address ADDRESS`"
        ) from None
