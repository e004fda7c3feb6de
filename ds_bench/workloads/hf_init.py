"""Weight initialisation of the causal LMs from scratch (GPT-2, Llama): HF's scheme, drawn per parameter
from a generator seeded by (``--seed``, the parameter's name in the HF model), so that every layout
starts from the same weights.

The same seed gives the same model whatever builds it: the plain HF model, DeepSpeed ZeRO-3's partitioned
build (``zero.Init``), a pipeline stage holding some of the layers (``ds_bench.workloads.gpt2_pipe`` names
its parameters as the HF model does), or AutoTP (sharded after the build, so it shards these weights). A
parameter's values depend on the seed, its name and its shape only, not on which rank or stage builds it,
on partitioning, or on what was drawn before it: a layout comparison compares layouts, not draws. This is
Megatron-LM's CPU initialisation idea (a layer's weights from a generator of its own, drawn whole on the
CPU in fp32, then copied in: the same values on any device and in any precision), one generator per
parameter.

The distributions are HF's ``_init_weights`` (transformers 5.x; GPT-2's and Llama's): linear, GPT-2
``Conv1D`` and embedding weights normal(0, ``initializer_range`` = 0.02), GPT-2's residual projections
(attention and MLP ``c_proj``) normal(0, 0.02 / sqrt(2 n_layer)) (the GPT-2 paper's scaled init), an
embedding's padding row 0, biases 0, LayerNorm / RMSNorm weights 1 and biases 0. A tied weight (the LM
head is the token embedding) is drawn once, under the name it is first met by (the embedding's).

HF's own init is switched off while the model is built (``hf_init_skipped``: it would draw the weights
once more, or under ``zero.Init`` write into empty partitions); ``initialize`` then writes every
parameter, each module's parameters gathered whole around the writes when partitioned (rank 0's values
kept; every rank draws the same ones). A module with parameters of a kind not listed above is refused.
Mixture-of-experts models (Mixtral, Qwen3-MoE): the router's weight and the experts' stacked 3-D weights are
normal(0, ``initializer_range``) as HF draws them, each expert of a stacked weight from a generator of its own; a
parameter left on the meta device (experts a rank does not hold: ``ds_bench.engines.moe_layer``) is skipped here
and its rank's experts drawn by ``draw_experts`` where they are placed.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable

import torch
from torch import nn

from ds_bench.engines import zero_init

INIT_STD = 0.02  # initializer_range of GPT2Config and LlamaConfig


def gpt2_std(n_layer: int, std: float = INIT_STD) -> Callable[[str], float]:
    """The weight std of a GPT-2 module, by its HF name: the residual projections ``c_proj`` scaled."""
    residual = std / math.sqrt(2 * n_layer)
    return lambda name: residual if name.endswith("c_proj") else std


def constant_std(std: float = INIT_STD) -> Callable[[str], float]:
    """One weight std for every module (Llama)."""
    return lambda name: std


@contextlib.contextmanager
def hf_init_skipped():
    """Build an HF model without HF's weight init (``initialize`` writes every parameter afterwards); the
    rest of ``post_init`` (weight tying included) runs as usual."""
    from transformers.modeling_utils import PreTrainedModel

    original = PreTrainedModel.initialize_weights
    PreTrainedModel.initialize_weights = lambda self: None
    try:
        yield
    finally:
        PreTrainedModel.initialize_weights = original


@torch.no_grad()
def initialize(model: nn.Module, seed: int, std_of: Callable[[str], float],
               hf_name: Callable[[str], str] = lambda name: name) -> None:
    """Every parameter of ``model`` from its own seeded generator. ``std_of``: a weight's std by its module's
    HF name; ``hf_name``: a module's name in the HF model, given its name in ``model`` (a pipeline stage's)."""
    seen: set[int] = set()
    for name, module in model.named_modules():
        params = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen and not p.is_meta]
        if not params:
            continue
        seen.update(id(p) for _, p in params)
        canonical = hf_name(name)
        with zero_init.gathered([p for _, p in params]):
            for param_name, param in params:
                _init_parameter(module, param_name, param, f"{seed}:{canonical}.{param_name}", std_of(canonical))


def _init_parameter(module: nn.Module, param_name: str, param: torch.Tensor, key: str, std: float) -> None:
    """One parameter by HF's rule for its module's kind (module docstring)."""
    from transformers.pytorch_utils import Conv1D

    if _is_norm(module):
        param.fill_(1.0 if param_name == "weight" else 0.0)
    elif param_name == "bias" and isinstance(module, (nn.Linear, Conv1D)):
        param.zero_()
    elif _is_routed(module) and param.dim() == 3:  # stacked experts: each from its own generator
        for expert in range(param.shape[0]):
            param[expert].copy_(_normal(param.shape[1:], std, f"{key}[{expert}]"))
    elif param_name == "weight" and isinstance(module, (nn.Linear, Conv1D, nn.Embedding)) or _is_routed(module):
        param.copy_(_normal(param.shape, std, key))
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            param[module.padding_idx].zero_()
    else:
        raise TypeError(f"no initialisation rule for {type(module).__name__}.{param_name} ({key})")


def draw_experts(seed: int, hf_name: str, shape: torch.Size, std: float, experts: range) -> torch.Tensor:
    """The values ``initialize`` gives ``experts`` of the stacked expert weight ``hf_name`` (module name and
    parameter, in the HF model) of ``shape`` (E x ...): each expert from its own generator, so a rank draws only
    the experts it holds."""
    return torch.stack([_normal(shape[1:], std, f"{seed}:{hf_name}[{e}]") for e in experts])


def _is_routed(module: nn.Module) -> bool:
    """An MoE router or stacked experts by class name (``MixtralTopKRouter``, ``Qwen3MoeExperts``): every weight
    normal(0, std), as HF's ``_init_weights``."""
    return type(module).__name__.endswith(("TopKRouter", "Experts"))


def _is_norm(module: nn.Module) -> bool:
    """HF's test: LayerNorm or RMSNorm by class name (models define their own)."""
    return isinstance(module, nn.LayerNorm) or any(k in type(module).__name__ for k in ("LayerNorm", "RMSNorm"))


def _normal(shape: torch.Size, std: float, key: str) -> torch.Tensor:
    """normal(0, std) of ``shape``, fp32 on the CPU, from the generator of ``key`` (a stable hash of it:
    Python's own ``hash`` of a string changes from process to process)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=generator)
