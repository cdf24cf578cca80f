"""On-policy distillation: a teacher scores the student's own samples, token by token.

The student samples as in RL; the teacher gives the log-probability of each sampled token
(``teacher_logp``); the per-token advantage is the negative reverse-KL estimate on that token

    A_t = coef * (teacher_logp_t - student_logp_t)  +  reward_coef * A_task

used with the policy gradient (the PPO-clip loss of ``algorithm.policy_loss``), each token
rewarded by its own term only (no discounting across tokens). In expectation over the student's
samples, maximising it minimises KL(student || teacher): Agarwal et al., "On-Policy Distillation
of Language Models: Learning from Self-Generated Mistakes" (GKD, 2024), and Thinking Machines'
"On-Policy Distillation" recipe (Lu et al., 2025). ``student_logp`` is the trainer's own
logprob before the update (``old_logp``, at the sampling temperature); the teacher is scored at
temperature 1. ``reward_coef = 0`` is pure distillation; > 0 mixes in the task's advantage
(``algorithm.advantage``).

Teachers:

- ``ColocatedTeacher``: the teacher's HF model in the trainer process, eval mode, no grad,
  ``teacher_micro_batch`` sequences per forward.
- ``ServedTeacher``: an ``rlx rollout-serve`` of the teacher answers ``ScoreTokens`` (prompt
  logprobs of given token ids) at ``algorithm.distill.teacher_server``; the user starts it.

Teacher and student must share a tokenizer (``check_same_tokenizer``, run by pre-flight).
Left out: full-vocabulary (exact) KL, which needs the teacher's logits, not its logprobs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from rlx.config.errors import ConfigError
from rlx.trainer.batch import TrainBatch
from rlx.trainer.packing import MicroBatch, build

if TYPE_CHECKING:
    from rlx.config.algorithm import DistillConfig


def check_same_tokenizer(student_path: str, teacher_path: str) -> None:
    """Refuse a teacher whose tokenizer differs from the student's: token ids would mean different text."""
    from rlx.trainer.model import check_model_dir, load_tokenizer

    if not Path(teacher_path, "config.json").is_file():
        raise ConfigError(
            f"algorithm.distill.teacher={teacher_path!r} is not a model directory (no config.json); "
            "set it to a local Hugging Face directory of the teacher or its Hub id (ORG/NAME[@REVISION]), or add "
            "algorithm.distill.teacher_build_if_missing=tiny_math_teacher to build the tiny-math "
            "teacher there first"
        )
    check_model_dir(teacher_path, "algorithm.distill.teacher")
    student, teacher = load_tokenizer(student_path), load_tokenizer(teacher_path)
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    if s_vocab != t_vocab:
        differ = sorted(set(s_vocab.items()) ^ set(t_vocab.items()), key=lambda kv: kv[1])[:3]
        raise ConfigError(
            f"algorithm.distill.teacher={teacher_path!r} has another tokenizer than model.path="
            f"{student_path!r} ({len(t_vocab)} vs {len(s_vocab)} tokens; e.g. {differ}); on-policy "
            "distillation scores the student's token ids with the teacher, so pick a teacher of the "
            "same tokenizer family"
        )
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        if getattr(student, name) != getattr(teacher, name):
            raise ConfigError(
                f"algorithm.distill.teacher={teacher_path!r}: its {name} is {getattr(teacher, name)}, "
                f"the student's is {getattr(student, name)}; pick a teacher of the same tokenizer"
            )


class ColocatedTeacher:
    def __init__(self, path: str, device: torch.device, micro_batch: int, chunk_size: int = 1024) -> None:
        from transformers import AutoModelForCausalLM

        from rlx.trainer.logprobs import can_split_head

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
        self.model.requires_grad_(False)
        self.device, self.micro_batch, self.chunk_size = device, micro_batch, chunk_size
        self.split_head = can_split_head(self.model)

    @torch.no_grad()
    def logprobs(self, full: TrainBatch) -> torch.Tensor:
        """[B, T] teacher logprobs of the batch's completion tokens (0 where the mask is 0), on the CPU."""
        from rlx.trainer.logprobs import completion_logprobs

        out = torch.zeros(full.mask.shape, dtype=torch.float32)
        for start in range(0, full.size, self.micro_batch):
            mb = build(full, list(range(start, min(start + self.micro_batch, full.size))), packed=False)
            logp, _ = completion_logprobs(
                self.model, mb.to(self.device), 1.0, self.chunk_size, split_head=self.split_head
            )
            out[mb.rows] = logp.float().cpu()
        return out


class ServedTeacher:
    def __init__(self, address: str, token: str = "", timeout_s: float = 120.0) -> None:
        self.address, self.token, self.timeout_s = address, token, timeout_s

    def logprobs(self, full: TrainBatch) -> torch.Tensor:
        """[B, T] teacher logprobs from the server: one ``ScoreTokens`` request for the whole batch."""
        sequences, starts, rows = [], [], []
        prompt_len = full.input_ids.shape[1] - full.completion_ids.shape[1]
        for i in range(full.size):
            num_completion = int(full.mask[i].sum())
            if num_completion == 0:  # nothing to score (a sample that ended before its first token)
                continue
            prompt = full.input_ids[i, :prompt_len][full.attention_mask[i, :prompt_len].bool()].tolist()
            sequences.append(prompt + full.completion_ids[i, :num_completion].tolist())
            starts.append(len(prompt))
            rows.append(i)
        scored = asyncio.run(self._score(sequences, starts)) if sequences else []
        out = torch.zeros(full.mask.shape, dtype=torch.float32)
        for i, row in zip(rows, scored, strict=True):
            out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
        return out

    async def _score(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        from rlx.rollout.client import RolloutClient
        from rlx.rollout.protocol import ScoreTokens

        client = RolloutClient([self.address], self.token, timeout_s=self.timeout_s)
        try:
            reply = await client.call(0, ScoreTokens(token_ids=sequences, start=starts), timeout_s=self.timeout_s)
        finally:
            client.close()
        return reply.logprobs


def make_teacher(d: DistillConfig, auth_token: str, chunk_size: int, device: torch.device):
    """The teacher ``algorithm.distill`` asks for, or None when distillation is off; ``auth_token``
    (rollout.auth_token) reaches a served one, ``chunk_size`` (trainer.logprob_chunk_size) bounds a colocated
    one's logits."""
    if not d.teacher:
        return None
    if d.teacher_placement == "served":
        return ServedTeacher(d.teacher_server, auth_token, d.timeout_s)
    return ColocatedTeacher(d.teacher, device, d.teacher_micro_batch, chunk_size)


def distill_advantages(
    teacher, full: TrainBatch, micro: list[MicroBatch], task_advantages: torch.Tensor, coef: float, reward_coef: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token advantages [B, T] (see the module docstring) and the reverse-KL metrics.

    ``micro`` carries this rank's ``old_logp``; other ranks' rows arrive through an all-reduce."""
    student = torch.zeros(full.mask.shape, dtype=torch.float32)
    for mb in (mb for mb in micro if mb.num_tokens):
        student[mb.rows] = mb.batch.old_logp.float().cpu()
    if dist.is_initialized() and dist.get_world_size() > 1:
        device = micro[0].batch.mask.device
        student = student.to(device)
        dist.all_reduce(student)
        student = student.cpu()
    teacher_logp = teacher.logprobs(full)
    mask = full.mask.float()
    reverse_kl = (student - teacher_logp) * mask
    advantages = -coef * reverse_kl
    if reward_coef:
        task = task_advantages if task_advantages.dim() == 2 else task_advantages.unsqueeze(-1)
        advantages = advantages + reward_coef * task * mask
    tokens = mask.sum().clamp(min=1.0)
    return advantages, {
        "distill_reverse_kl": float(reverse_kl.sum() / tokens),
        "teacher_logp_mean": float((teacher_logp * mask).sum() / tokens),
    }
