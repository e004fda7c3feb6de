"""Mixture-of-experts causal-LM training: HuggingFace ``MixtralForCausalLM`` (or ``Qwen3MoeForCausalLM`` for the
Qwen3 sizes) built from config at the published shapes (``--size``: tiny, mixtral-8x7b, mixtral-8x22b,
qwen3-30b-a3b; the table, its sources and the total / active parameter and FLOPs formulas are
``ds_bench.workloads.moe_shapes``) or a custom ``--layers L --hidden H --heads A`` with ``--experts E --top-k K``,
from scratch (HF's init per parameter from (seed, name): ``ds_bench.workloads.hf_init``).

Under ``--engine deepspeed`` the sparse blocks run as DeepSpeed's MoE layer with the same weights, sharded over
``--expert-parallel`` ranks (``ds_bench.engines.degrees.expert_parallel``: the paths, the router, what EP = 1 costs);
DDP and FSDP train HF's own blocks, HF adding its router loss. ``--seq-len``, ``--attn``,
``--activation-checkpointing`` and ``--data`` as llama (``ds_bench.workloads.causal_lm``).
Model FLOPs: ``moe_shapes.flops_per_token`` (6 N_active + 12 L H Q T).
"""

from __future__ import annotations

import torch
from torch import nn

from ds_bench.data import text
from ds_bench.engines import moe_layer
from ds_bench.engines.degrees import expert_parallel, sequence_parallel
from ds_bench.errors import UserError
from ds_bench.workloads import hf_init, moe_shapes
from ds_bench.workloads.causal_lm import DEFAULT_ATTENTION, LlamaFamilyWorkload, enable_checkpointing
from ds_bench.workloads.gpt2_shapes import check_custom_shape
from ds_bench.workloads.llama import MIN_POSITIONS

DEFAULT_EXPERTS, DEFAULT_TOP_K = moe_shapes.DEFAULT_EXPERTS, moe_shapes.DEFAULT_TOP_K


class MoEWorkload(LlamaFamilyWorkload):
    name = "moe"
    sizes = tuple(moe_shapes.SHAPES)
    default_size = moe_shapes.DEFAULT_SIZE
    default_lr = 3e-4
    preload = ("transformers.models.mixtral.modeling_mixtral", "deepspeed.moe.layer")
    long_context = False
    ulysses = True
    """Ulysses shards its attention as llama's; DeepSpeed's MoE layer needs ``ds_bench.engines.degrees.moe_sequence_parallel``
    beside it (``--moe-path moe-layer``)."""
    custom_shapes = True
    mixture_of_experts = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.seq_len = cfg.seq_len
        if cfg.model_path is not None:
            raise UserError("--model with --workload moe: pretrained MoE weights are not loaded yet; use --size or "
                            "--layers/--hidden/--heads")
        self.shape = self.shape_of(cfg)
        if cfg.layers is not None:
            self.size = moe_shapes.custom_label(self.shape)
        self.experts = self.shape.experts
        self.aux_loss_weight = self.shape.aux_loss_weight if cfg.aux_loss_weight is None else cfg.aux_loss_weight
        self.router = expert_parallel.Router(self.shape.top_k, cfg.capacity_factor, self.aux_loss_weight)
        own_blocks = cfg.engine != "deepspeed" or cfg.moe_path == expert_parallel.HF_BLOCKS
        self.config = moe_config(self.shape, cfg.seq_len, native_aux_loss=own_blocks and self.aux_loss_weight > 0,
                                 aux_loss_weight=self.aux_loss_weight)
        self.config._attn_implementation = cfg.attn or DEFAULT_ATTENTION
        self.files = None if cfg.data == "synthetic" else text.find_text_files(cfg.data)
        if self.files and self.shape.vocab < moe_shapes.GPT2_VOCAB:
            raise UserError(f"--data {cfg.data}: text is read with GPT-2's {moe_shapes.GPT2_VOCAB}-token BPE, above "
                            f"{self.size}'s {self.shape.vocab}-token vocabulary (its own tokenizer is not loaded "
                            "yet); use --data synthetic, or tiny, qwen3-30b-a3b or a custom shape")

    @classmethod
    def check_long_context_flag(cls, flag: str) -> None:
        """ALST's tiling and checkpoint offload: measured on gpt2 and llama, not on a mixture of experts."""
        raise UserError(f"{flag} with --workload moe: not measured yet (ALST's tiling runs on gpt2 and llama)")

    @classmethod
    def shape_of(cls, cfg) -> moe_shapes.MoEShape:
        """The shape ``cfg``'s flags build (``moe_shapes.run_shape``; ``cfg`` a ``RunConfig``, or a study's parsed
        run flags): a one-line ``UserError`` for a partial custom shape, one beside ``--size``, an unknown size or
        a top-k above the experts."""
        custom = check_custom_shape(cfg.layers, cfg.hidden, cfg.heads)
        if custom and cfg.size is not None:
            raise UserError("--layers/--hidden/--heads give the shape: not with --size")
        if not custom and cfg.size is not None and cfg.size not in moe_shapes.SHAPES:
            raise UserError(f"--size {cfg.size!r} is not a size of workload moe; known: {', '.join(moe_shapes.SHAPES)}")
        shape = moe_shapes.run_shape(cfg.size, cfg.layers, cfg.hidden, cfg.heads, cfg.experts, cfg.top_k)
        expert_parallel.check_top_k(shape.top_k, shape.experts)
        return shape

    @classmethod
    def check_study(cls, degrees: dict[str, tuple[int, ...]], flags) -> None:
        """The dense checks, then the model the study's run flags build: each ``--expert-parallel`` value must
        divide its experts (``expert_parallel.check_split``, as a run's, before any job starts)."""
        super().check_study(degrees, flags)
        experts = cls.shape_of(flags).experts
        for ep in degrees.get("expert_parallel", ()):
            expert_parallel.check_split(ep, experts, " (--experts E sets them)")

    @classmethod
    def expert_param_count(cls, flags) -> int:
        return moe_shapes.expert_param_count(cls.shape_of(flags))

    moe_blocks: list = []
    """The model's DeepSpeed MoE blocks once ``build_model`` made them (the loss reads their aux losses)."""
    placed: tuple | None = None
    """(``ExpertParallelPlan``, rank) once ``place_experts`` was called: ``build_model`` builds DeepSpeed MoE layers."""

    def place_experts(self, plan: expert_parallel.ExpertParallelPlan, rank: int) -> None:
        """Build the model with DeepSpeed's MoE layers holding this rank's experts (``--moe-path moe-layer``)."""
        self.placed = plan, rank

    def build_model(self) -> nn.Module:
        """HF's model (``CausalLMWorkload.build_model``), or with the experts placed: the HF model built with its
        stacked experts on the meta device, every other weight drawn as always, then each sparse block replaced by a
        ``MoEBlock`` whose experts are this rank's slice of the same draws (``hf_init.draw_experts``): the weights an EP = 1
        or a DDP run starts from, and no rank ever allocates experts it does not hold."""
        if self.placed is None:
            return super().build_model()
        plan, rank = self.placed
        std = self.weight_std()
        with hf_init.hf_init_skipped(), moe_layer.experts_on_meta(self.experts_class()):
            model = self.model_class()(self.config)
        hf_init.initialize(model, self.cfg.seed, std)
        seed = self.cfg.seed
        self.moe_blocks = moe_layer.to_moe_layers(model, plan, rank, lambda name, shape, held: hf_init.draw_experts(
            seed, name, shape, std(name.rpartition(".")[0]), held))
        model.loss_type = "ForCausalLM"
        if self.cfg.activation_checkpointing:
            enable_checkpointing(model, self.cfg.selective_checkpointing)
        return model

    def experts_class(self) -> type:
        if self.shape.arch == "qwen3_moe":
            from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

            return Qwen3MoeExperts
        from transformers.models.mixtral.modeling_mixtral import MixtralExperts

        return MixtralExperts

    def model_class(self):
        if self.shape.arch == "qwen3_moe":
            from transformers import Qwen3MoeForCausalLM

            return Qwen3MoeForCausalLM
        from transformers import MixtralForCausalLM

        return MixtralForCausalLM

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        """The causal-LM loss, + the aux-loss weight x the MoE layers' mean load-balancing loss (DeepSpeed's MoE
        layer; HF's own blocks add HF's router loss themselves). A rank's aux loss is of its own tokens; under Ulysses
        (its slice of a sequence) the group's mean (``sequence_parallel.group_mean``), as data-parallel ranks' is
        averaged by DeepSpeed's gradient averaging."""
        loss = super().loss(model, batch)
        aux = moe_layer.aux_loss(self.moe_blocks, self.aux_loss_weight, self.shape.top_k)
        if aux is None:
            return loss
        return loss + (sequence_parallel.group_mean(aux, batch) if "group_size" in batch else aux)

    def model_flops_per_sample(self, model: nn.Module) -> float:
        """seq_len x ``moe_shapes.flops_per_token``: 6 N_active + 12 L H Q T (model FLOPs, no recomputation)."""
        return self.seq_len * moe_shapes.flops_per_token(self.shape, self.seq_len)

    def hardware_flops_per_sample(self, model: nn.Module) -> float:
        if not self.cfg.activation_checkpointing:
            return self.model_flops_per_sample(model)
        return self.seq_len * moe_shapes.hardware_flops_per_token(self.shape, self.seq_len)



def moe_config(shape: moe_shapes.MoEShape, seq_len: int, native_aux_loss: bool = False, aux_loss_weight: float = 0.0):
    """A from-scratch ``MixtralConfig`` / ``Qwen3MoeConfig`` of ``shape``: no dropout, no KV cache, no router
    jitter; HF's own router loss only where HF's blocks train (``native_aux_loss``)."""
    common = dict(vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.n_layer,
                  num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
                  num_experts_per_tok=shape.top_k, max_position_embeddings=max(MIN_POSITIONS, seq_len),
                  rms_norm_eps=shape.rms_norm_eps, tie_word_embeddings=False, attention_dropout=0.0, use_cache=False,
                  output_router_logits=native_aux_loss, router_aux_loss_coef=aux_loss_weight,
                  rope_parameters={"rope_type": "default", "rope_theta": moe_shapes.ROPE_THETA})
    if shape.arch == "qwen3_moe":
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(moe_intermediate_size=shape.expert_intermediate, num_experts=shape.experts,
                              norm_topk_prob=True, decoder_sparse_step=1, **common)
    from transformers import MixtralConfig

    return MixtralConfig(intermediate_size=shape.expert_intermediate, num_local_experts=shape.experts,
                         router_jitter_noise=0.0, **common)
