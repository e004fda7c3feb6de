"""GPT-2 causal-LM training / fine-tuning: HuggingFace ``GPT2LMHeadModel`` at the standard sizes.

Sizes (``--size``, HF GPT-2 shapes, vocabulary 50,257, tied LM head): tiny (2 layers, width 64,
2 heads; for tests), small (12/768/12, 124,439,808 parameters), medium (24/1024/16, 354,823,168),
large (36/1280/20, 774,030,080), xl (48/1600/25, 1,557,611,200); the GPT-3 paper's shapes
``gpt3-125m`` .. ``gpt3-13b``, and custom shapes ``--layers L --hidden H --heads A``
(``ds_bench.workloads.gpt2_shapes``: the table, its sources, the parameter formula). Models from scratch
use no dropout, as nanoGPT does for pretraining, so runs are deterministic across ZeRO stages.
``--model PATH`` starts from local pretrained weights instead (``from_pretrained`` on a folder with
``config.json``; its own dropout is kept and the default learning rate drops to 5e-5).

``--seq-len`` (default 1024; ``n_positions`` grows to fit for models from scratch).
``--data`` and the loss as every causal LM (``ds_bench.workloads.causal_lm``). ``--activation-checkpointing``
recomputes each block in the backward pass. Reports tokens/s and sequences/s; model FLOPs from
``ds_bench.workloads.flops.gpt2_flops_per_token`` (PaLM's 6N + 12 L d T, recomputation not counted).
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

from ds_bench.data import text
from ds_bench.errors import UserError
from ds_bench.workloads import flops, hf_init
from ds_bench.workloads.causal_lm import DEFAULT_ATTENTION, FINETUNE_LR, CausalLMWorkload, check_pretrained_folder
from ds_bench.workloads.gpt2_shapes import SHAPES, VOCAB, Shape, check_custom_shape, custom_shape, named_shape

FUSED_GELU = "gelu_pytorch_tanh"
"""GPT-2's ``gelu_new`` (HF NewGELUActivation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in
five elementwise ops) and ``gelu_pytorch_tanh`` (``F.gelu(approximate="tanh")``, one kernel) are the same
function (Hendrycks & Gimpel 2016, eq. 2's tanh form); nanoGPT uses the latter. Models from scratch and
``--model`` folders that say ``gelu_new`` run it."""
class GPT2Workload(CausalLMWorkload):
    name = "gpt2"
    sizes = tuple(SHAPES)
    default_size = "small"
    default_lr = 6e-4  # GPT-3 paper's rate for the 125M model, nanoGPT's default
    custom_shapes = True
    preload = ("transformers.models.gpt2.modeling_gpt2",)
    partitioned_build = True
    """FLOPs from the config; the weight init gathered (``hf_init``). Not with ``--model`` (set in ``__init__``):
    ``from_pretrained`` builds on the meta device and loads partitioned only through transformers' own ZeRO-3
    path, which needs ``accelerate``."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.seq_len = cfg.seq_len
        custom = check_custom_shape(cfg.layers, cfg.hidden, cfg.heads)
        if custom and (cfg.size is not None or cfg.model_path is not None):
            raise UserError(f"--layers/--hidden/--heads give the shape: not with {'--size' if cfg.size else '--model'}")
        if cfg.model_path is not None:
            if cfg.size is not None:
                raise UserError("--size and --model are exclusive: the shape comes from --model's config.json")
            self.size = None
            self.config = pretrained_config(cfg.model_path, cfg.seq_len)
            if cfg.tiled_mlp and self.config.resid_pdrop > 0:
                raise UserError(f"--tiled-mlp with --model {cfg.model_path}: its MLP ends in dropout (resid_pdrop "
                                f"{self.config.resid_pdrop}), and TiledMLP recomputes it in backward with another mask")
            self.default_lr = FINETUNE_LR
            self.partitioned_build = False
        else:
            shape = custom_shape(cfg.layers, cfg.hidden, cfg.heads, cfg.seq_len) if custom \
                else named_shape(self.size, cfg.seq_len)
            self.size = shape.label
            self.config = shape_config(shape)
        self.config._attn_implementation = cfg.attn or DEFAULT_ATTENTION
        if self.config.activation_function == "gelu_new":  # the same tanh GELU, as one fused op
            self.config.activation_function = FUSED_GELU
        self.files = None if cfg.data == "synthetic" else text.find_text_files(cfg.data)

    @property
    def hidden_size(self) -> int:
        return self.config.n_embd

    @property
    def attention_shape(self) -> tuple[int, int, int, int]:
        """Multi-head attention: as many KV heads as heads."""
        c = self.config
        return c.n_layer, c.n_head, c.n_head, c.n_embd // c.n_head

    def weight_std(self):
        """HF GPT-2's: 0.02, the residual projections 0.02 / sqrt(2 n_layer)."""
        return hf_init.gpt2_std(self.config.n_layer, self.config.initializer_range)

    def model_class(self):
        from transformers import GPT2LMHeadModel

        return GPT2LMHeadModel

    @property
    def pipeline_blocks(self) -> int:
        return self.config.n_layer

    def build_pipeline(self, stages: int, partition: str) -> nn.Module:
        """This rank's stage (``ds_bench.workloads.gpt2_pipe``) from scratch, with the plain model's weights."""
        from ds_bench.workloads import gpt2_pipe

        return gpt2_pipe.build_pipeline(self.config, stages, partition, self.cfg.seed,
                                        self.cfg.activation_checkpointing, self.weight_std())

    def pipeline_batches(self, data_rank: int, data_world_size: int, micro_batch: int) -> Iterator[tuple]:
        """Every stage of a replica reads the same stream: the first its inputs, the last its labels."""
        return ((b["input_ids"], b["input_ids"]) for b in self.batches(data_rank, data_world_size, micro_batch))

    def model_flops_per_sample(self, model: nn.Module) -> float:
        """seq_len x ``flops.gpt2_flops_per_token`` of the model's config (a pipeline's stages have none:
        the workload's): PaLM's 6N + 12 L d T.

        N counts the block matmul weights and the (tied) LM head, not the embedding lookups; see
        ``flops.gpt2_matmul_params``. Activation checkpointing does not change it (model FLOPs).
        """
        return self.seq_len * flops.gpt2_flops_per_token(*_shape(_config_of(model, self.config)), self.seq_len)

    def hardware_flops_per_sample(self, model: nn.Module) -> float:
        """With ``--activation-checkpointing``: + one forward (PaLM's 8N + 16 L d T), for HFU."""
        if not self.cfg.activation_checkpointing:
            return self.model_flops_per_sample(model)
        return self.seq_len * flops.gpt2_hardware_flops_per_token(*_shape(_config_of(model, self.config)),
                                                                  self.seq_len)

    def model_settings(self, model: nn.Module) -> dict[str, str]:
        """Attention implementation and MLP activation of the model's config (a pipeline's blocks share the
        workload's)."""
        config = _config_of(model, self.config)
        return {"attn_implementation": config._attn_implementation,
                "activation_function": config.activation_function, "tokenizer": self.tokenizer_source}

def gpt2_config(size: str, seq_len: int):
    """A from-scratch ``GPT2Config`` of a named size; no dropout, room for ``seq_len`` positions."""
    return shape_config(named_shape(size, seq_len))


def shape_config(shape: Shape):
    """A from-scratch ``GPT2Config`` of ``shape``; no dropout."""
    from transformers import GPT2Config

    return GPT2Config(vocab_size=VOCAB, n_positions=shape.n_positions, n_layer=shape.n_layer, n_embd=shape.n_embd,
                      n_head=shape.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)


def pretrained_config(path: str, seq_len: int):
    """The ``GPT2Config`` of a local pretrained folder, checked against the run's flags."""
    from transformers import GPT2Config

    check_pretrained_folder(path, "gpt2")
    config = GPT2Config.from_pretrained(path)
    if seq_len > config.n_positions:
        raise UserError(f"--seq-len {seq_len} exceeds the {config.n_positions} positions of --model {path}")
    config.use_cache = False
    return config


def _config_of(model: nn.Module, fallback):
    """An HF model's own config; a ``PipelineModule`` (no config) is built from the workload's."""
    config = getattr(model, "config", None)
    return config if hasattr(config, "n_layer") else fallback


def _shape(c) -> tuple[int, int, int, int]:
    """(layers, width, MLP width, vocabulary) of a GPT2Config, as the FLOPs formulas take them."""
    return c.n_layer, c.n_embd, c.n_inner or 4 * c.n_embd, c.vocab_size
