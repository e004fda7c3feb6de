"""HuggingFace weight initialisation for a model built partitioned (DeepSpeed ZeRO-3 ``zero.Init``),
giving the weights an unpartitioned build gives with the same seed.

What transformers 5.x does (read in 5.23): a ``PreTrainedModel`` initialises its weights in ``post_init``
at the end of its own ``__init__`` (``init_weights`` -> ``initialize_weights``: a post-order walk calling
``_init_weights`` on every module; GPT-2: normal(0, 0.02), the residual projections at
0.02 / sqrt(2 n_layer), zero biases). Under ``zero.Init`` every submodule's parameters are partitioned
when that submodule's ``__init__`` returns, so this runs on empty tensors: the init silently does not
apply (the torch defaults stay, e.g. embeddings normal(0, 1)) and draws nothing from the RNG.
transformers' own ZeRO-3 path (``HfDeepSpeedConfig`` kept alive + ``_from_config``: torch and HF init
switched off during construction, then ``integrations.deepspeed.initialize_weights_zero3``, each
module's parameters gathered, rank 0 drawing) needs ``accelerate``, and draws in another order than
an unpartitioned ``GPT2LMHeadModel(config)`` (no construction-time draws; the nested ``GPT2Model``'s
init no longer comes before the LM head is constructed), so the same seed gives other weights.

``partitioned_weight_init`` keeps the unpartitioned order instead: while a partitioned build is open
it swaps ``PreTrainedModel.initialize_weights`` for the same walk with each module's parameters (and
its direct children's, which ``_init_weights`` may touch) gathered around ``_init_weights``. Every
rank draws the same numbers at the same moment as in an unpartitioned build (construction-time torch
init runs on whole tensors before each submodule is partitioned), rank 0's are kept, and each rank's
RNG ends where an unpartitioned build leaves it. At most one module's parameters are whole at a time.
"""

from __future__ import annotations

import contextlib

import torch

from ds_bench.engines import zero_init


@contextlib.contextmanager
def partitioned_weight_init():
    """Inside a ``zero.Init`` context: HF's weight init on gathered parameters. Otherwise a no-op."""
    if not zero_init.building_partitioned():
        yield
        return
    from transformers import initialization as init
    from transformers.modeling_utils import PreTrainedModel

    original = PreTrainedModel.initialize_weights

    @torch.no_grad()
    def initialize_weights(self):
        with init.guard_torch_init_functions():
            _apply_gathered(self, self._initialize_weights, self.is_custom_code(), PreTrainedModel)

    PreTrainedModel.initialize_weights = initialize_weights
    try:
        yield
    finally:
        PreTrainedModel.initialize_weights = original


def _apply_gathered(module: torch.nn.Module, fn, custom_code: bool, pretrained_cls: type) -> None:
    """transformers' ``smart_apply`` (``PreTrainedModel.initialize_weights``), each call of ``fn`` gathered."""
    for child in module.children():
        child_fn = child._initialize_weights if isinstance(child, pretrained_cls) else fn
        _apply_gathered(child, child_fn, custom_code, pretrained_cls)
    params = list(module.parameters(recurse=False))
    params += [p for c in module.children() if not isinstance(c, pretrained_cls) for p in c.parameters(recurse=False)]
    with zero_init.gathered(params):
        fn(module, custom_code)
