"""Mixture-of-experts routing in the trainer: rollout routing replay (R3) and the routes' disagreement.

``Routing.install(model)`` takes over the forward of every top-k router of a transformers MoE model (the
``mlp.gate`` modules of Qwen3-MoE, OLMoE and their kin: ``weight`` [experts, hidden], ``top_k``,
``norm_topk_prob``). Each router computes its logits and softmax as the model does, and its own top-k; with
replay (``algorithm.routing_replay=r3``) it then takes the experts the engine chose for each token instead, and
its gate weights are the softmax probabilities of those experts, renormalised over them where the model's config
says (``norm_topk_prob``), as R3 does: the gradient still reaches the router through those weights. A token the
engine recorded no route for (the last sampled token, never fed to the engine; a padding position) keeps its own
top-k. Without replay the router computes exactly what the model's own forward does.

Routes are indexed by MoE layer (the order of the routers in the model), as vLLM's ``routed_experts`` and the hf
backend's recording are. Each forward with routes also counts, per layer, the tokens whose expert set (order
aside) differs between the engine and the trainer's own top-k: ``route_disagreement``. Left out: routers with a
bias or a grouped top-k (DeepSeek-V3, gpt-oss), Mixtral's ``block_sparse_moe``: ``Routing.install`` finds no
router there and pre-flight says so.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from rlx.formats.experts import routers


class Routing:
    """The routers' shared state: the routes to replay in the running forward, and the disagreement counts."""

    def __init__(self, num_layers: int, replay: bool) -> None:
        self.replay = replay
        self.routes: torch.Tensor | None = None  # [N, layers, top_k] of the running forward, -1: none
        self.differ = torch.zeros(num_layers, dtype=torch.float64)
        self.counted = torch.zeros(num_layers, dtype=torch.float64)

    @classmethod
    def install(cls, model, replay: bool) -> Routing:
        found = routers(model)
        if not found:
            raise ValueError(
                f"{type(model).__name__} has no top-k router rlx can replay (mlp.gate with top_k); set "
                "algorithm.routing_replay=off for this model"
            )
        routing = cls(len(found), replay)
        for layer, router in enumerate(found):
            router.forward = _routed_forward(router, routing, layer)
        return routing

    @contextlib.contextmanager
    def tokens(self, routes: torch.Tensor | None):
        """Route the forward inside by ``routes`` ([N, layers, top_k] in the order the routers see the tokens:
        a padded batch row-major, a packed row as packed)."""
        self.routes = routes
        try:
            yield
        finally:
            self.routes = None

    def choose(self, layer: int, probs: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        """The experts of each token at ``layer``: the engine's where recorded and replay is on, else ``own``."""
        if self.routes is None:
            return own
        given = self.routes[:, layer].to(device=own.device, dtype=torch.long)
        if given.shape[0] != own.shape[0]:
            raise ValueError(f"routes of {given.shape[0]} tokens for a forward over {own.shape[0]}")
        have = given[:, 0] >= 0
        with torch.no_grad():
            differ = (given.sort(dim=-1).values != own.sort(dim=-1).values).any(dim=-1) & have
            self.differ[layer] += float(differ.sum())
            self.counted[layer] += float(have.sum())
        return torch.where(have[:, None], given, own) if self.replay else own

    def take_metrics(self) -> dict[str, float]:
        """``route_disagreement`` (share of routed tokens whose experts differ, every layer) and per layer
        ``route_disagreement_l{i}`` since the last call; summed over ranks when there are several."""
        import torch.distributed as dist

        counts = torch.stack([self.differ, self.counted])
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(counts)  # gloo (CPU) and NCCL both take float64
        self.differ.zero_()
        self.counted.zero_()
        if float(counts[1].sum()) == 0:
            return {}
        metrics = {"route_disagreement": float(counts[0].sum() / counts[1].sum())}
        for layer, (differ, counted) in enumerate(counts.T.tolist()):
            metrics[f"route_disagreement_l{layer}"] = differ / max(counted, 1.0)
        return metrics


def _routed_forward(router, routing: Routing, layer: int):
    def forward(hidden_states):
        hidden_states = hidden_states.reshape(-1, router.weight.shape[1])
        logits = F.linear(hidden_states, router.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        own = torch.topk(probs, router.top_k, dim=-1).indices
        chosen = routing.choose(layer, probs, own)
        weights = probs.gather(-1, chosen)
        if getattr(router, "norm_topk_prob", False):
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(logits.dtype), chosen

    return forward


def batch_routes(mb) -> torch.Tensor | None:
    """The micro-batch's routes in the order its forward sees the tokens, or None."""
    if mb.packed is not None:
        return mb.packed.routes
    routes = mb.batch.routes
    return None if routes is None else routes.reshape(-1, *routes.shape[2:])
