"""Expert parallelism for mixture-of-experts models: the layout of an ``--expert-parallel EP`` run, the path
that runs it, and the model's MoE blocks as DeepSpeed's ``deepspeed.moe.layer.MoE``.

Layout: the E experts of every MoE block are sharded over EP consecutive ranks (DeepSpeed's
``groups._create_expert_and_data_parallel``: expert-parallel groups of EP consecutive ranks), each holding
E / EP of them; everything else (attention, norms, router, embedding, head) is replicated over all W ranks.
Every rank reads its own batch (W data-parallel replicas for the non-expert parameters; under Ulysses, W / S, each
rank its slice of a sequence: ``ds_bench.engines.degrees.moe_sequence_parallel``); an expert's gradient is averaged over the
W / EP ranks that hold it (its expert-data-parallel group). Tokens travel to
their experts and back by two all-to-alls per MoE block in forward (dispatch, combine) and two in backward;
deepspeed 0.19.8 skips them at EP = 1 (``MOELayer.forward``: ``if self.ep_size > 1``; DeepSpeed PR #7997).

Paths (``PATHS``; the record's ``expert_parallel.path``):
- ``autoep``: DeepSpeed's AutoEP (``expert_parallel: {enabled, autoep_size, preset_model}``) on the HF model,
  where the installed DeepSpeed and transformers work together (``autoep_mismatch``).
- ``moe-layer``: each HF sparse block replaced by a ``deepspeed.moe.layer.MoE`` (``ds_bench.engines.moe_layer``) holding the same
  router weight and this rank's experts (``to_moe_layers``): DeepSpeed's top-k gate is Mixtral's router for
  k >= 2 (softmax over the experts, the k largest, their weights renormalised to 1; ``top2_2nd_expert_sampling``
  off, no noise), so at EP = 1 the model gives HF's logits (``tests/test_moe_model.py``). Its top-1 gate weighs
  the expert's output by its probability, where Mixtral's weight is 1: top-k 1 is refused on this path.
- ``hf``: HF's own blocks (``--moe-path hf``; DDP and FSDP always): every expert on every rank, no expert
  parallelism, no capacity padding; what DeepSpeed's MoE layer costs at EP = 1 is its time against this.

Router settings (``Router``): top-k, capacity factor (0: no token dropping, every expert takes what it is
sent, as Mixtral and Qwen3-MoE train; > 0: each expert takes at most ceil(k x tokens / E x factor) and drops the
rest, DeepSpeed's ``_capacity``) and the aux-loss weight: the loss adds weight x k x the mean over MoE blocks of
DeepSpeed's load-balancing loss, the scale of HF's (``ds_bench.engines.moe_layer.aux_loss``); HF's own blocks add
HF's.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import ClassVar

import torch

from ds_bench.engines.degrees.mesh import DegreePlan, register
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
class ExpertParallelPlan(DegreePlan):
    field: ClassVar[str] = "expert_parallel"
    splits_replica: ClassVar[bool] = False
    routes_tokens: ClassVar[bool] = True

    size: int
    """EP: ranks the experts of a block are sharded over."""
    world_size: int
    experts: int
    router: Router
    path: str = MOE_LAYER
    arch: str = "mixtral"
    """The model's architecture (``moe_shapes.MoEShape.arch``): AutoEP's ``preset_model``."""
    sequence_parallel: int = 1
    """S of an Ulysses run (``with_sequence_parallel``): S ranks share each non-expert replica."""

    @property
    def local_experts(self) -> int:
        return self.experts // self.size

    @property
    def data_parallel_size(self) -> int:
        """Replicas of the non-expert parameters: every rank, or every sequence-parallel group under Ulysses."""
        return self.world_size // self.sequence_parallel

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

    def record_settings(self) -> dict:
        return {k: v for k, v in self.describe().items() if k != "size"}

    def deepspeed_config(self, ds_cfg: dict) -> dict:
        return deepspeed_config(self, ds_cfg)

    def prepare(self, workload, rank: int) -> None:
        """DeepSpeed's MoE layers hold this rank's experts only: the workload builds them so."""
        if self.path == MOE_LAYER:
            workload.place_experts(self, rank)

    def whole_params(self, model, numel) -> int:
        return whole_model_params(model, self, numel)

    def rank_params_held(self, model, numel) -> dict:
        return params_held(model, numel)

    def verdict_terms(self, workload, micro_batch: int, comm: dict | None, build: dict) -> dict:
        """The dispatch and combine all-to-alls, as measured where the MoE layer calls them; the gradients of the
        experts this rank holds (``build``'s ``rank_params_held``)."""
        held = build.get("rank_params_held")
        return {"expert_parallel": self.size, "ep_all_to_all_bytes": (comm or {}).get("bytes_per_step") or 0.0,
                "expert_params": held["experts"] if held else 0}


@register("expert_parallel")
def _from_run(cfg, workload, world_size: int, local_world_size: int | None) -> ExpertParallelPlan | None:
    """A moe run: its experts' layout (EP = 1 without ``--expert-parallel``; DDP and FSDP: HF's own blocks)."""
    if workload.router is None:
        return None
    path = cfg.moe_path if cfg.engine == "deepspeed" else HF_BLOCKS
    plan = resolve(cfg.expert_parallel or 1, world_size, workload.experts, workload.router, path, workload.shape.arch)
    return with_sequence_parallel(plan, cfg.sequence_parallel or 1)


def with_sequence_parallel(plan: ExpertParallelPlan, size: int) -> ExpertParallelPlan:
    """The experts' plan under Ulysses (``--sequence-parallel S``, pure; before joining): its non-expert replicas
    are world / S, and only DeepSpeed's MoE layer path is measured with it (``UserError``, exit 2; the layer's
    override: ``ds_bench.engines.degrees.moe_sequence_parallel``)."""
    if size == 1:
        return plan
    if plan.path != MOE_LAYER:
        raise UserError(f"--moe-path {plan.path} with --sequence-parallel {size}: not measured yet (DeepSpeed's MoE "
                        f"layer composes with Ulysses: --moe-path {MOE_LAYER})")
    return dataclasses.replace(plan, sequence_parallel=size)


def check_split(size: int, experts: int, hint: str = "") -> None:
    """``--expert-parallel size`` must divide the model's experts (a run's, or each value of a study's axis)."""
    if experts % size:
        raise UserError(f"--expert-parallel {size} does not divide the model's {experts} experts: every rank of a "
                        f"group holds an equal share{hint}")


def check_top_k(top_k: int, experts: int) -> None:
    if top_k > experts:
        raise UserError(f"--top-k {top_k} is above the model's {experts} experts")


def resolve(size: int, world_size: int, experts: int, router: Router, requested_path: str = "auto",
            arch: str = "mixtral") -> ExpertParallelPlan:
    """The plan of ``--expert-parallel size`` (checked before joining: ``UserError``, exit 2)."""
    check_split(size, experts)
    check_top_k(router.top_k, experts)
    path = choose_path(requested_path)
    if path == HF_BLOCKS and size > 1:
        raise UserError(f"--moe-path hf with --expert-parallel {size}: HF's own blocks hold every expert on every "
                        "rank; use --moe-path moe-layer")
    if path == HF_BLOCKS and router.drop_tokens:
        raise UserError(f"--capacity-factor {router.capacity_factor:g} with HF's own MoE blocks: they drop no tokens; "
                        "the capacity is DeepSpeed's MoE layer's (--moe-path moe-layer)")
    if path == MOE_LAYER and router.top_k < 2:
        raise UserError("--top-k 1 with DeepSpeed's MoE layer: its top-1 gate weighs an expert's output by the "
                        "gate probability, Mixtral's by 1 (renormalised), so the model would not be Mixtral; use "
                        "--top-k 2 or more")
    return ExpertParallelPlan(size, world_size, experts, router, path, arch)


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


def deepspeed_config(plan: ExpertParallelPlan | None, ds_cfg: dict) -> dict:
    """The run's config, with AutoEP's section on the ``autoep`` path (its preset: the model's architecture)."""
    if plan is None or plan.path != AUTOEP:
        return ds_cfg
    return {**ds_cfg, "expert_parallel": {"enabled": True, "autoep_size": plan.size, "preset_model": plan.arch}}


def is_expert(param: torch.Tensor) -> bool:
    """DeepSpeed's mark on an expert's parameter (``deepspeed.moe.experts.Experts``)."""
    return getattr(param, "allreduce", True) is False


def params_held(model: torch.nn.Module, numel) -> dict[str, int]:
    """Parameters this rank holds: ``experts`` (its local experts: DeepSpeed's, or all of HF's stacked ones) and
    ``rest``; ``numel`` counts a parameter whole (``ds_bench.engines.full_numel``)."""
    held = {"experts": 0, "rest": 0}
    for name, p in model.named_parameters():
        held["experts" if is_expert(p) or ".experts." in f".{name}" else "rest"] += numel(p)
    return held


def whole_model_params(model: torch.nn.Module, plan: ExpertParallelPlan | None, numel) -> int:
    """The whole model's parameters from one rank's: its experts x EP (each holds 1 / EP of them) + the rest."""
    held = params_held(model, numel)
    return held["experts"] * (plan.size if plan else 1) + held["rest"]
