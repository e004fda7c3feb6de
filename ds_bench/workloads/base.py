"""The contract every workload meets, and the data helpers they share.

A workload turns a ``RunConfig`` into a model, an endless stream of per-rank batches, a loss and
(for FLOPs/MFU) a model-FLOPs count. Its constructor checks flags and paths; ``load_data`` reads
and checks ``--data`` itself, before the process group is joined (``ds_bench.config.preflight``).
``ds_bench.workloads.REGISTRY`` maps names to the classes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator

import torch

from ds_bench.config.run_config import RunConfig
from ds_bench.errors import UserError

Batch = dict[str, torch.Tensor]


class Workload(ABC):
    name: str = ""
    sizes: tuple[str, ...] = ()
    default_size: str | None = None
    default_lr: float = 1e-3
    sample_unit: str = "samples"
    """What one sample is, in the summary: ``images``, ``sequences``..."""
    custom_shapes: bool = False
    """Whether ``--layers/--hidden/--heads`` can shape the model (GPT-2)."""
    preload: tuple[str, ...] = ()
    """Modules ``build_model`` imports, imported before the memory baseline (``ds_bench.run.training``) so a
    build's time and memory are the model's, not its library's (transformers' GPT-2: ~38 MiB RSS, ~1 s)."""
    attention: bool = False
    """Whether the model has attention whose implementation ``--attn`` chooses (GPT-2)."""
    autotp: bool = False
    """Whether DeepSpeed's AutoTP can shard the model (``--tensor-parallel``; llama; ``tensor_parallel_divisors``)."""
    long_context: bool = False
    """Whether the model is an HF causal LM whose MLP and loss ALST's tiling can split (``--tiled-mlp``,
    ``--tiled-loss``): gpt2 and llama."""
    ulysses: bool = False
    """Whether DeepSpeed-Ulysses' HF wrapper can shard the model's sequence (``--sequence-parallel``): llama."""
    router = None
    """A mixture of experts' router settings (``ds_bench.engines.degrees.expert_parallel.Router``); None: a dense model."""
    experts: int | None = None
    """Experts per MoE block; None: a dense model."""
    mixture_of_experts: bool = False
    """Whether the model has experts ``--expert-parallel`` shards (moe): known before one is built."""
    convolutions: bool = False
    """Whether ``--channels-last`` applies (ResNet)."""
    partitioned_build: bool = False
    """Whether DeepSpeed ZeRO-3 may build the model partitioned (``deepspeed.zero.Init``,
    ``ds_bench.engines.zero_init``): true only where ``model_flops_per_sample`` needs no forward pass
    (partitioned weights are empty tensors) and ``build_model`` gives the same weights partitioned or
    not (GPT-2, Llama: ``ds_bench.workloads.hf_init``). False: every rank builds the whole model first."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.size = cfg.size or self.default_size
        if self.sizes and self.size not in self.sizes:
            raise UserError(f"--size {self.size!r} is not a size of workload {self.name}; "
                            f"known: {', '.join(self.sizes)}")
        if not self.sizes and cfg.size is not None:
            raise UserError(f"--size is not used by workload {self.name} (it has one size)")
        shape_flags = [f for f, v in (("--layers", cfg.layers), ("--hidden", cfg.hidden), ("--heads", cfg.heads))
                       if v is not None]
        if shape_flags and not self.custom_shapes:
            raise UserError(f"{'/'.join(shape_flags)}: workload {self.name} has no custom shapes (gpt2 and llama have)")
        if cfg.channels_last and not self.convolutions:
            raise UserError(f"--channels-last: workload {self.name} has no 2-D convolutions to lay out (resnet has)")
        if cfg.attn is not None:
            self.check_attention_flag()
        if cfg.tensor_parallel is not None:
            self.check_tensor_parallel_flag()
        if cfg.sequence_parallel is not None:
            self.check_sequence_parallel_flag()
        tiles = [flag for flag, on in (("--tiled-mlp", cfg.tiled_mlp), ("--tiled-loss", cfg.tiled_loss),
                                       ("--checkpoint-offload", cfg.checkpoint_offload)) if on]
        if tiles:
            self.check_long_context_flag("/".join(tiles))

    @classmethod
    def check_attention_flag(cls) -> None:
        """``--attn`` (a run's, or a sweep's axis) needs a model with attention."""
        if not cls.attention:
            raise UserError(f"--attn: workload {cls.name} has no attention (gpt2 and llama have)")

    @classmethod
    def check_tensor_parallel_flag(cls) -> None:
        """``--tensor-parallel`` (a run's, or a sweep's axis beyond 1) needs a model AutoTP can shard."""
        if not cls.autotp:
            raise UserError(f"--tensor-parallel: DeepSpeed's AutoTP cannot shard workload {cls.name} (llama it can; "
                            "GPT-2's fused Conv1D projections are on AutoTP's unsupported list)")

    @classmethod
    def check_long_context_flag(cls, flag: str) -> None:
        """The tiling options and checkpoint offload (a run's, or a study's axis) need an HF causal LM."""
        if not cls.long_context:
            raise UserError(f"{flag}: workload {cls.name} is not a causal language model (gpt2 and llama are)")

    @classmethod
    def check_sequence_parallel_flag(cls) -> None:
        """``--sequence-parallel`` (a run's, or a study's axis beyond 1) needs a model Ulysses' HF wrapper can shard."""
        if cls.ulysses:
            return
        if cls.long_context:  # measured, deepspeed 0.19.8 / transformers 5.24: the first forward fails
            raise UserError(f"--sequence-parallel: DeepSpeed-Ulysses' HF wrapper cannot shard workload {cls.name} "
                            "(llama it can): it returns the attention output as [batch, tokens, width] and GPT-2 "
                            "reshapes a [batch, tokens, heads, head width] one")
        raise UserError(f"--sequence-parallel: workload {cls.name} is not a causal language model (llama is)")

    @classmethod
    def check_degrees(cls, degrees: dict[str, int]) -> None:
        """A study's largest value of each parallel degree (``config.layout.DEGREES`` fields) against what
        this workload's model can be split by, where that is known before a model is built."""
        if degrees.get("tensor_parallel", 1) > 1:
            cls.check_tensor_parallel_flag()
        if degrees.get("sequence_parallel", 1) > 1:
            cls.check_sequence_parallel_flag()
        if degrees.get("expert_parallel", 1) > 1 and not cls.mixture_of_experts:
            raise UserError(f"--expert-parallel: workload {cls.name} has no experts (moe has)")

    @classmethod
    def has_pipeline(cls) -> bool:
        """Whether the workload builds a DeepSpeed pipeline model (``build_pipeline``): known before one is built."""
        return cls.build_pipeline is not Workload.build_pipeline

    @classmethod
    def check_study(cls, degrees: dict[str, tuple[int, ...]], flags) -> None:
        """A study's degree axes (every value, ``jobs.flags.degrees_of``) and its run flags (``flags``: the ``run``
        flags every job gets, parsed, not yet checked: ``jobs.flags.run_flags_of``), before any job starts: the
        degrees' largest values (``check_degrees``) and the moe flags' values and workload
        (``config.degrees.expert.check_moe_flags``). A workload whose shape bounds a degree adds its own."""
        from ds_bench.config.degrees.expert import check_moe_flags

        cls.check_degrees({name: max(values) for name, values in degrees.items() if values})
        check_moe_flags(flags)

    @classmethod
    def expert_param_count(cls, flags) -> int:
        """The parameters expert parallelism shards in the model ``flags`` build (``check_study``'s); 0: dense."""
        return 0

    @property
    def hidden_size(self) -> int | None:
        """Width used to resolve ZeRO bucket sizes set to "auto" (HF convention)."""
        return None

    @property
    def tokens_per_sample(self) -> int | None:
        return None

    @property
    def pipeline_blocks(self) -> int | None:
        """Blocks a pipeline can split (``--pipeline-stages``); None: no pipeline model."""
        return None

    @property
    def attention_heads(self) -> tuple[int, int] | None:
        """(attention heads, KV heads): what a ``--sequence-parallel`` degree must divide; None: no attention."""
        return None

    def sequence_parallel_all_to_all_elements(self, micro_batch: int, size: int) -> int:
        """Elements one rank sends in Ulysses' all-to-alls in one micro-step (``ds_bench.perf.comm_bound``)."""
        return 0

    @property
    def tensor_parallel_divisors(self) -> dict[str, int] | None:
        """The model widths a ``--tensor-parallel`` degree must divide, by name; None: AutoTP cannot shard it."""
        return None

    def tensor_parallel_all_reduce_elements(self, micro_batch: int) -> int:
        """Elements a tensor-parallel group all-reduces in one micro-step (``ds_bench.perf.comm_bound``)."""
        return 0

    def build_pipeline(self, stages: int, partition: str) -> torch.nn.Module:
        """This rank's stage of the model as a ``deepspeed.pipe.PipelineModule`` (after joining), with a
        ``stage_layout()`` method: a dict for the record (stage, layers, blocks, params, unique_params)."""
        raise NotImplementedError(f"workload {self.name} has no pipeline model")

    def pipeline_batches(self, data_rank: int, data_world_size: int, micro_batch: int) -> Iterator[tuple]:
        """``batches`` of data-parallel replica ``data_rank`` as ``(inputs, labels)``, as the pipeline engine reads them."""
        raise NotImplementedError(f"workload {self.name} has no pipeline model")

    def load_data(self, world_size: int, micro_batch: int) -> None:
        """Read and check ``--data`` (files, decoding, tokenizing, sample count) and keep it for
        ``batches``; a ``UserError`` naming the data when it is bad or too small. Called on every
        rank before the process group is joined; loads once, so calling it again is cheap.
        Synthetic data: nothing to read."""

    @abstractmethod
    def build_model(self) -> torch.nn.Module: ...

    @abstractmethod
    def batches(self, rank: int, world_size: int, micro_batch: int) -> Iterator[Batch]:
        """Endless per-rank batches on the CPU; each rank sees its own shard."""

    @abstractmethod
    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor: ...

    def model_flops_per_sample(self, model: torch.nn.Module) -> float | None:
        """Training FLOPs (forward + backward) per sample; None where not counted."""
        return None

    def hardware_flops_per_sample(self, model: torch.nn.Module) -> float | None:
        """FLOPs the device actually executes per sample: model FLOPs plus any recomputation."""
        return self.model_flops_per_sample(model)

    def model_settings(self, model: torch.nn.Module) -> dict[str, str]:
        """Speed settings the built model runs with, read back from it, as record fields
        (``attn_implementation``, ``activation_function``); none for most workloads."""
        return {}


def shard_epochs(n: int, rank: int, world_size: int, micro_batch: int, seed: int) -> Iterator[torch.Tensor]:
    """Endless index batches over this rank's shard of ``n`` samples, reshuffled every epoch.

    Every rank draws the same permutation (same seed) and takes every ``world_size``-th index,
    the DistributedSampler scheme, so shards are disjoint and equal in size.
    """
    check_enough(n, world_size, micro_batch, f"--data holds {n} samples")
    per_rank = n // world_size
    gen = torch.Generator().manual_seed(seed)
    while True:
        shard = torch.randperm(n, generator=gen)[rank:per_rank * world_size:world_size]
        for start in range(0, per_rank - micro_batch + 1, micro_batch):
            yield shard[start:start + micro_batch]


def check_enough(n: int, world_size: int, micro_batch: int, subject: str, need_note: str = "") -> None:
    """A UserError starting with ``subject`` unless ``n`` samples give every rank one micro-batch."""
    if n // world_size < micro_batch:
        raise UserError(f"{subject}: too few for {world_size} rank(s) x micro-batch {micro_batch}, "
                        f"which need at least {world_size * micro_batch}{need_note}")


def cycle_pool(pool: list[Batch]) -> Iterator[Batch]:
    while True:
        yield from pool
