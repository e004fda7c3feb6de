"""Llama-family causal-LM training: HuggingFace ``LlamaForCausalLM`` built from config at the published
shapes (``--size``: tiny, llama3.2-1b, llama3.2-3b, llama3.1-8b, llama3.1-70b; the table, its sources and
the parameter and FLOPs formulas are ``ds_bench.workloads.llama_shapes``) or a custom ``--layers L --hidden H
--heads A`` (``llama_shapes.custom_shape``: the capacity search's scaled families), from scratch: no dropout,
weights drawn by HF's init scheme per parameter from (seed, name) (``ds_bench.workloads.hf_init``: the same
weights unpartitioned, under a partitioned ZeRO-3 build and sharded by AutoTP).
``--model PATH`` starts from local pretrained weights instead (a ``save_pretrained`` folder of model_type
llama; its own tokenizer reads ``--data``; default learning rate 5e-5, and the whole model built on
every rank).

``--seq-len`` (default 1024; rotary positions, so any length builds), ``--attn`` (default SDPA, as GPT-2),
``--activation-checkpointing``, ``--data`` and the loss as every causal LM
(``ds_bench.workloads.causal_lm``): text is read through the ``--model`` folder's tokenizer, else GPT-2's
BPE, whose 50,257 ids fall inside every size's vocabulary (``tiny`` has exactly GPT-2's; the published
sizes keep their 128,256 rows); the record's ``tokenizer`` says which.
Model FLOPs: ``llama_shapes.flops_per_token`` (6 N + 12 L H Q T, grouped-query attention and SwiGLU counted).
"""

from __future__ import annotations

from torch import nn

from ds_bench.data import text
from ds_bench.errors import UserError
from ds_bench.workloads import llama_shapes
from ds_bench.workloads.causal_lm import DEFAULT_ATTENTION, FINETUNE_LR, LlamaFamilyWorkload, check_pretrained_folder
from ds_bench.workloads.gpt2_shapes import check_custom_shape

MIN_POSITIONS = 2048
"""``max_position_embeddings`` of a model from scratch (at least the sequence): rotary positions hold no
weights, so it only bounds the rotary cache."""


class LlamaWorkload(LlamaFamilyWorkload):
    name = "llama"
    sizes = tuple(llama_shapes.SHAPES)
    default_size = "llama3.2-1b"
    default_lr = 3e-4  # Llama 3's peak pretraining rate for the 8B model (Llama 3 paper, section 3.4.1)
    preload = ("transformers.models.llama.modeling_llama",)
    partitioned_build = True
    autotp = True
    ulysses = True

    custom_shapes = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.seq_len = cfg.seq_len
        custom = check_custom_shape(cfg.layers, cfg.hidden, cfg.heads)
        if custom and (cfg.size is not None or cfg.model_path is not None):
            raise UserError(f"--layers/--hidden/--heads give the shape: not with {'--size' if cfg.size else '--model'}")
        if custom:
            self.shape = llama_shapes.custom_shape(cfg.layers, cfg.hidden, cfg.heads)
            self.size = llama_shapes.custom_label(self.shape)
            self.config = llama_config(self.shape, cfg.seq_len)
        elif cfg.model_path is not None:
            if cfg.size is not None:
                raise UserError("--size and --model are exclusive: the shape comes from --model's config.json")
            self.config = pretrained_config(cfg.model_path)
            self.shape = shape_of(self.config)
            self.size, self.default_lr, self.partitioned_build = None, FINETUNE_LR, False
        else:
            self.shape = llama_shapes.SHAPES[self.size]
            self.config = llama_config(self.shape, cfg.seq_len)
        self.config._attn_implementation = cfg.attn or DEFAULT_ATTENTION
        self.files = None if cfg.data == "synthetic" else text.find_text_files(cfg.data)

    @property
    def tensor_parallel_divisors(self) -> dict[str, int]:
        """What a tensor-parallel degree must divide: AutoTP splits the heads, the KV heads and the MLP."""
        return {"attention heads": self.shape.heads, "KV heads": self.shape.kv_heads, "hidden size": self.shape.hidden,
                "MLP width": self.shape.intermediate}

    def tensor_parallel_all_reduces(self) -> int:
        """AutoTP's all-reduces per micro-step, each of micro-batch x sequence x hidden elements (measured:
        ``ds_bench.measure.layout_comm``): per block 2 in forward (the row-parallel attention output and MLP down
        projections) and 5 in backward (the column-parallel q, k, v, gate and up projections' input
        gradients, one each: AutoTP does not fuse them as Megatron-LM's 2 + 2 do, Shoeybi et al. 2019 sec. 3),
        1 more with activation checkpointing, full or selective (the attention output's, recomputed: torch's
        non-reentrant checkpoint stops before the MLP's, ``perf.step.TP_RECOMPUTED``); and 2 outside the blocks:
        the vocabulary-parallel embedding's forward and LM head's backward."""
        per_block = 2 + 5 + (1 if self.cfg.activation_checkpointing else 0)
        return per_block * self.shape.n_layer + 2

    def tensor_parallel_all_reduce_elements(self, micro_batch: int) -> int:
        return self.tensor_parallel_all_reduces() * micro_batch * self.seq_len * self.shape.hidden

    def model_class(self):
        from transformers import LlamaForCausalLM

        return LlamaForCausalLM

    def model_flops_per_sample(self, model: nn.Module) -> float:
        """seq_len x ``llama_shapes.flops_per_token``: 6 N + 12 L H Q T (model FLOPs, no recomputation)."""
        return self.seq_len * llama_shapes.flops_per_token(self.shape, self.seq_len)

    def hardware_flops_per_sample(self, model: nn.Module) -> float:
        """With ``--activation-checkpointing``: + one forward of the blocks (``llama_shapes.hardware_flops_per_token``).
        Not counted: ``--tiled-mlp``'s recomputed MLP forward (``ds_bench.engines.tiling``), so HFU reads low with it."""
        if not self.cfg.activation_checkpointing:
            return self.model_flops_per_sample(model)
        return self.seq_len * llama_shapes.hardware_flops_per_token(self.shape, self.seq_len)



def pretrained_config(path: str):
    """The ``LlamaConfig`` of a local pretrained folder (``save_pretrained``'s, weights beside it)."""
    from transformers import LlamaConfig

    check_pretrained_folder(path, "llama")
    config = LlamaConfig.from_pretrained(path)
    config.use_cache = False
    return config


def shape_of(config) -> llama_shapes.LlamaShape:
    """The shape of a ``LlamaConfig``, for the FLOPs, the parameter count and AutoTP's divisors."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return llama_shapes.LlamaShape(config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                                   config.num_key_value_heads or config.num_attention_heads, head_dim,
                                   config.intermediate_size, config.vocab_size, bool(config.tie_word_embeddings))


def llama_config(shape: llama_shapes.LlamaShape, seq_len: int):
    """A from-scratch ``LlamaConfig`` of ``shape``: no dropout, no KV cache, Llama 3's rotary base."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                       num_hidden_layers=shape.n_layer, num_attention_heads=shape.heads,
                       num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
                       max_position_embeddings=max(MIN_POSITIONS, seq_len), rms_norm_eps=llama_shapes.RMS_NORM_EPS,
                       rope_parameters={"rope_type": "default", "rope_theta": llama_shapes.ROPE_THETA},
                       tie_word_embeddings=shape.tied, attention_dropout=0.0, use_cache=False)
