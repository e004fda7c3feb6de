"""Expert parallelism for mixture-of-experts models: the layout of an ``--expert-parallel EP`` run, the path
that runs it, and the model's MoE blocks as DeepSpeed's ``deepspeed.moe.layer.MoE``.

Layout: the E experts of every MoE block are sharded over EP consecutive ranks (DeepSpeed's
``groups._create_expert_and_data_parallel``: expert-parallel groups of EP consecutive ranks), each holding
E / EP of them; everything else (attention, norms, router, embedding, head) is replicated over all W ranks.
Every rank reads its own batch (W data-parallel replicas for the non-expert parameters); an expert's
gradient is averaged over the W / EP ranks that hold it (its expert-data-parallel group). Tokens travel to
their experts and back by two all-to-alls per MoE block in forward (dispatch, combine) and two in backward;
deepspeed 0.19.8 skips them at EP = 1 (``MOELayer.forward``: ``if self.ep_size > 1``; DeepSpeed PR #7997).

Paths (``PATHS``; the record's ``expert_parallel.path``):
- ``autoep``: DeepSpeed's AutoEP (``expert_parallel: {enabled, autoep_size, preset_model}``) on the HF model,
  where the installed DeepSpeed and transformers work together (``autoep_mismatch``).
- ``moe-layer``: each HF sparse block replaced by ``MoEBlock``, a ``deepspeed.moe.layer.MoE`` holding the same
  router weight and this rank's experts (``to_moe_layers``): DeepSpeed's top-k gate is Mixtral's router for
  k >= 2 (softmax over the experts, the k largest, their weights renormalised to 1; ``top2_2nd_expert_sampling``
  off, no noise), so at EP = 1 the model gives HF's logits (``tests/test_moe_model.py``). Its top-1 gate weighs
  the expert's output by its probability, where Mixtral's weight is 1: top-k 1 is refused on this path.
- ``hf``: HF's own blocks (``--moe-path hf``; DDP and FSDP always): every expert on every rank, no expert
  parallelism, no capacity padding; what DeepSpeed's MoE layer costs at EP = 1 is its time against this.

Router settings (``Router``): top-k, capacity factor (0: no token dropping, every expert takes what it is
sent, as Mixtral and Qwen3-MoE train; > 0: each expert takes at most ceil(k x tokens / E x factor) and drops the
rest, DeepSpeed's ``_capacity``) and the aux-loss weight: the loss adds weight x the mean over MoE blocks of
DeepSpeed's load-balancing loss (GShard's E x sum_e mean-gate_e x top-1-share_e; HF's own blocks add HF's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from dataclasses import dataclass

import torch
from torch import nn

from ds_bench.errors import UserError

MOE_LAYER, AUTOEP, HF_BLOCKS = "moe-layer", "autoep", "hf"
PATHS = ("auto", AUTOEP, MOE_LAYER, HF_BLOCKS)
"""``--moe-path``: auto (AutoEP where it works with the installed transformers, else moe-layer), or one of them."""


@dataclass(frozen=True)
class Router:
    top_k: int
    capacity_factor: float = 0.0
    """0: no token dropping; > 0: DeepSpeed's capacity factor (``capacity`` below)."""
    aux_loss_weight: float = 0.0

    @property
    def drop_tokens(self) -> bool:
        return self.capacity_factor > 0

    def capacity(self, tokens: int, experts: int) -> int | None:
        """Tokens one expert takes in one micro-step when dropping: ceil(tokens / E x factor x k), DeepSpeed's
        ``sharded_moe._capacity`` (with ``min_capacity`` 0 here); None: no limit. In DeepSpeed's arithmetic:
        factor x k a float32 tensor, the product in float32, which rounds a whole product up or down by one
        where float64 would not (100 tokens, 4 experts, factor 1.1, k 2: 55, where float64 says 56)."""
        if not self.drop_tokens:
            return None
        return int(torch.ceil((tokens / experts) * torch.tensor(self.capacity_factor * self.top_k)))


@dataclass(frozen=True)
class ExpertParallelPlan:
    size: int
    """EP: ranks the experts of a block are sharded over."""
    world_size: int
    experts: int
    router: Router
    path: str = MOE_LAYER

    @property
    def local_experts(self) -> int:
        return self.experts // self.size

    @property
    def data_parallel_size(self) -> int:
        """Replicas of the non-expert parameters: every rank."""
        return self.world_size

    @property
    def expert_data_parallel_size(self) -> int:
        """Ranks holding each expert (and averaging its gradient): W / EP."""
        return self.world_size // self.size

    def first_expert(self, rank: int) -> int:
        """The global index of this rank's first expert: its place in its EP group x E / EP."""
        return rank % self.size * self.local_experts

    def describe(self) -> dict:
        """The record's ``expert_parallel`` settings."""
        r = self.router
        return {"path": self.path, "size": self.size, "experts": self.experts, "local_experts": self.local_experts,
                "data_parallel_size": self.data_parallel_size,
                "expert_data_parallel_size": self.expert_data_parallel_size, "top_k": r.top_k,
                "capacity_factor": r.capacity_factor or None, "drop_tokens": r.drop_tokens,
                "aux_loss_weight": r.aux_loss_weight}


def resolve(size: int, world_size: int, experts: int, router: Router, requested_path: str = "auto") -> ExpertParallelPlan:
    """The plan of ``--expert-parallel size`` (checked before joining: ``UserError``, exit 2)."""
    if experts % size:
        raise UserError(f"--expert-parallel {size} does not divide the model's {experts} experts: every rank of a "
                        "group holds an equal share")
    if router.top_k > experts:
        raise UserError(f"--top-k {router.top_k} is above the model's {experts} experts")
    path = choose_path(requested_path)
    if path == HF_BLOCKS and size > 1:
        raise UserError(f"--moe-path hf with --expert-parallel {size}: HF's own blocks hold every expert on every "
                        "rank; use --moe-path moe-layer")
    if path == MOE_LAYER and router.top_k < 2:
        raise UserError("--top-k 1 with DeepSpeed's MoE layer: its top-1 gate weighs an expert's output by the "
                        "gate probability, Mixtral's by 1 (renormalised), so the model would not be Mixtral; use "
                        "--top-k 2 or more")
    return ExpertParallelPlan(size, world_size, experts, router, path)


def choose_path(requested: str) -> str:
    """``--moe-path``: AutoEP where it works here (``autoep_mismatch``), else DeepSpeed's MoE layer."""
    mismatch = autoep_mismatch()
    if requested == AUTOEP and mismatch:
        raise UserError(f"--moe-path autoep: {mismatch}; use --moe-path moe-layer (or auto)")
    if requested == "auto":
        return MOE_LAYER if mismatch else AUTOEP
    return requested


def autoep_mismatch() -> str | None:
    """Why AutoEP cannot run with the installed DeepSpeed and transformers, or None.

    deepspeed 0.19.8's AutoEP presets (``module_inject/auto_ep_presets/base.py``) read transformers' output
    recorder registry as a dict, ``registry.get(key, default)``; transformers 5.x made it a
    ``_CanRecordRegistry`` whose ``get`` takes the model alone, so ``deepspeed.initialize`` fails with
    "_CanRecordRegistry.get() takes 2 positional arguments but 3 were given" (measured with transformers 5.24)."""
    import deepspeed
    import transformers

    try:
        from transformers.utils import output_capturing
    except ImportError:
        return None
    registry = getattr(output_capturing, "_CAN_RECORD_REGISTRY", None)
    try:
        inspect.signature(registry.get).bind("key", "default")
    except TypeError:
        return (f"deepspeed {deepspeed.__version__}'s AutoEP presets call the output-recorder registry of "
                f"transformers {transformers.__version__} with arguments it does not take")
    except (AttributeError, ValueError):
        pass
    return None


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
        """``stacked(name)``: the HF block's stacked expert weight ``name`` (``gate_up_proj``, ``down_proj``) whole;
        default: the block's own (which must then not be on the meta device)."""
        from deepspeed.moe.layer import MoE

        super().__init__()
        experts, router = block.experts, plan.router
        template = SwiGLUExpert(experts.hidden_dim, experts.intermediate_dim, experts.act_fn)
        self.moe = MoE(experts.hidden_dim, expert=template, num_experts=plan.experts, ep_size=plan.size,
                       k=router.top_k, capacity_factor=router.capacity_factor or 1.0, min_capacity=0,
                       drop_tokens=router.drop_tokens, use_rts=False, top2_2nd_expert_sampling=False)
        stacked = stacked or (lambda name: getattr(experts, name))
        with torch.no_grad():
            self.moe.deepspeed_moe.gate.wg.weight.copy_(block.gate.weight)
            first, local = plan.first_expert(rank), self.moe.deepspeed_moe.experts.deepspeed_experts
            for linear, name in (("gate_up", "gate_up_proj"), ("down", "down_proj")):
                whole = stacked(name)  # drawn whole, one block at a time: the other ranks' experts are dropped
                for i, expert in enumerate(local):
                    getattr(expert, linear).weight.copy_(whole[first + i])
                del whole
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
    ``draw(hf_name, shape)``: the values of a stacked expert weight left on the meta device
    (``experts_on_meta``), by its name in the HF model; None: the blocks' own weights."""
    names = {id(m): n for n, m in model.named_modules()}
    blocks = []
    for parent, name, block in sparse_blocks(model):
        experts = block.experts
        stacked = None if draw is None else (
            lambda param, e=experts: draw(f"{names[id(e)]}.{param}", getattr(e, param).shape))
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


def aux_loss(model: nn.Module, weight: float) -> torch.Tensor | None:
    """weight x the mean over MoE blocks of their last forward's load-balancing loss; None at weight 0."""
    losses = [b.l_aux for b in moe_blocks(model) if b.l_aux is not None]
    if not weight or not losses:
        return None
    return weight * torch.stack([l.float() for l in losses]).mean()


def param_groups(model: nn.Module) -> list[dict]:
    """The optimizer's parameter groups: DeepSpeed's ZeRO needs the experts' in groups of their own
    (``split_params_into_different_moe_groups_for_optimizer``) to reduce them over their expert-data-parallel
    group."""
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    return split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()), "name": "dense"})


def is_expert(param: torch.Tensor) -> bool:
    """DeepSpeed's mark on an expert's parameter (``deepspeed.moe.experts.Experts``)."""
    return getattr(param, "allreduce", True) is False


def params_held(model: nn.Module, numel) -> dict[str, int]:
    """Parameters this rank holds: ``experts`` (its local experts) and ``rest`` (replicated); ``numel`` counts
    a parameter whole (``ds_bench.engines.full_numel``)."""
    held = {"experts": 0, "rest": 0}
    for p in model.parameters():
        held["experts" if is_expert(p) else "rest"] += numel(p)
    return held


def whole_model_params(model: nn.Module, plan: ExpertParallelPlan | None, numel) -> int:
    """The whole model's parameters from one rank's: its experts x EP (each holds 1 / EP of them) + the rest."""
    held = params_held(model, numel)
    return held["experts"] * (plan.size if plan else 1) + held["rest"]


def deepspeed_config(plan: ExpertParallelPlan | None, ds_cfg: dict, arch: str = "mixtral") -> dict:
    """The run's config, with AutoEP's section on the ``autoep`` path."""
    if plan is None or plan.path != AUTOEP:
        return ds_cfg
    return {**ds_cfg, "expert_parallel": {"enabled": True, "autoep_size": plan.size, "preset_model": arch}}


def with_world(plan: ExpertParallelPlan, world_size: int) -> ExpertParallelPlan:
    return dataclasses.replace(plan, world_size=world_size)
