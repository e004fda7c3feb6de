"""DeepSpeed's MoE layer in an HF mixture of experts (``--moe-path moe-layer``; the layout, router and paths are
``ds_bench.engines.degrees.expert_parallel``'s): each HF sparse block (Mixtral's, Qwen3-MoE's) replaced by ``MoEBlock``, a
``deepspeed.moe.layer.MoE`` with the same router weight and this rank's experts; the HF model built with its
stacked experts on the meta device (``experts_on_meta``); the loss's aux term, the optimizer's parameter groups
and what a rank holds.

DeepSpeed's top-k gate is Mixtral's router for k >= 2 (softmax over the experts, the k largest, their weights
renormalised to 1; ``top2_2nd_expert_sampling`` off, no noise), so at EP = 1 the model gives HF's logits
(``tests/test_moe_model.py``).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ds_bench.engines.degrees.expert_parallel import ExpertParallelPlan, is_expert, params_held, whole_model_params  # noqa: F401

class SwiGLUExpert(nn.Module):
    """One Mixtral / Qwen3-MoE expert: down(silu(gate x) * up x), HF's fused gate_up layout."""

    def __init__(self, hidden: int, intermediate: int, act):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * up)


class MoEBlock(nn.Module):
    """An HF sparse MoE block as ``deepspeed.moe.layer.MoE``: same router weight, this rank's experts. Keeps the
    last forward's load-balancing loss and each forward's tokens per expert (``counts``, read by
    ``ds_bench.measure.expert_load``)."""

    def __init__(self, block: nn.Module, plan: ExpertParallelPlan, rank: int, stacked=None):
        """``stacked(name, experts)``: those ``experts`` (a range) of the HF block's stacked expert weight ``name``
        (``gate_up_proj``, ``down_proj``); default: the block's own (which must then not be on the meta device)."""
        from deepspeed.moe.layer import MoE

        super().__init__()
        experts, router = block.experts, plan.router
        template = SwiGLUExpert(experts.hidden_dim, experts.intermediate_dim, experts.act_fn)
        self.moe = MoE(experts.hidden_dim, expert=template, num_experts=plan.experts, ep_size=plan.size,
                       k=router.top_k, capacity_factor=router.capacity_factor or 1.0, min_capacity=0,
                       drop_tokens=router.drop_tokens, use_rts=False, top2_2nd_expert_sampling=False)
        stacked = stacked or (lambda name, held: getattr(experts, name)[held.start:held.stop])
        with torch.no_grad():
            self.moe.deepspeed_moe.gate.wg.weight.copy_(block.gate.weight)
            local = self.moe.deepspeed_moe.experts.deepspeed_experts
            held = range(plan.first_expert(rank), plan.first_expert(rank) + len(local))
            for linear, name in (("gate_up", "gate_up_proj"), ("down", "down_proj")):
                for expert, weight in zip(local, stacked(name, held)):
                    getattr(expert, linear).weight.copy_(weight)
        self.l_aux: torch.Tensor | None = None
        self.counts: list[torch.Tensor] = []

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out, self.l_aux, counts = self.moe(hidden_states)
        self.counts.append(counts)
        return out


def sparse_blocks(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, block) of every HF sparse MoE block: a module with a ``gate`` router and fused
    ``experts`` (``gate_up_proj``), Mixtral's and Qwen3-MoE's in transformers 5."""
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if hasattr(child, "gate") and hasattr(getattr(child, "experts", None), "gate_up_proj")]


def to_moe_layers(model: nn.Module, plan: ExpertParallelPlan, rank: int, draw=None) -> list[MoEBlock]:
    """Replace every sparse block of ``model`` by a ``MoEBlock`` holding this rank's experts (in place).
    ``draw(hf_name, shape, experts)``: those experts of a stacked expert weight left on the meta device
    (``experts_on_meta``), by its name in the HF model; None: the blocks' own weights."""
    names = {id(m): n for n, m in model.named_modules()}
    blocks = []
    for parent, name, block in sparse_blocks(model):
        experts = block.experts
        stacked = None if draw is None else (
            lambda param, held, e=experts: draw(f"{names[id(e)]}.{param}", getattr(e, param).shape, held))
        moe = MoEBlock(block, plan, rank, stacked).to(block.gate.weight.dtype)
        setattr(parent, name, moe)
        blocks.append(moe)
    return blocks


@contextlib.contextmanager
def experts_on_meta(*classes):
    """Build HF models whose stacked experts (``classes``: ``MixtralExperts``...) hold meta tensors: no rank
    allocates the experts it will not hold (``to_moe_layers`` draws its own)."""
    originals = {cls: cls.__init__ for cls in classes}

    def on_meta(original):
        def init(self, *args, **kwargs):
            with torch.device("meta"):
                original(self, *args, **kwargs)
        return init

    for cls, original in originals.items():
        cls.__init__ = on_meta(original)
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.__init__ = original


def moe_blocks(model: nn.Module) -> list[MoEBlock]:
    return [m for m in model.modules() if isinstance(m, MoEBlock)]


def aux_loss(blocks: list[MoEBlock], weight: float, top_k: int) -> torch.Tensor | None:
    """weight x k x the mean over ``blocks`` of their last forward's load-balancing loss; None at weight 0 or with no
    blocks. The k: DeepSpeed's gate loss is about 1 at an even load (GShard's E x sum_e mean-gate_e x share_e, the
    share of the first choices at k = 2, of all k choices over k above), HF's (``load_balancing_loss_func``, which
    the published ``router_aux_loss_coef`` weighs) about k: E x sum_e mean-gate_e x share of all k choices, the
    same as DeepSpeed's x k for k > 2 (per block; HF takes the blocks' tokens together). Measured on tiny, top-2:
    HF 2.0022, DeepSpeed 1.0030; top-3: 3.0023 and 1.0014."""
    losses = [b.l_aux for b in blocks if b.l_aux is not None]
    if not weight or not losses:
        return None
    return weight * top_k * torch.stack([l.float() for l in losses]).mean()


def param_groups(model: nn.Module) -> list[dict]:
    """The optimizer's parameter groups: DeepSpeed's ZeRO needs the experts' in groups of their own
    (``split_params_into_different_moe_groups_for_optimizer``) to reduce them over their expert-data-parallel
    group."""
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    return split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()), "name": "dense"})
