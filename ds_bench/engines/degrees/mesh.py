"""The run's parallel degrees on the engine side, as one mesh: each active degree's plan, and what the run path asks
of them all at once (as torchtitan's ``ParallelDims``): data-parallel coordinates, the DeepSpeed config keys, the
record's degree blocks, the model hooks (where the experts go, the ``mpu``), the batches a rank reads.

Each degree's engine module (``pipeline``, ``tensor_parallel``, ``sequence_parallel``, ``expert_parallel``)
registers here, once, the resolver that turns the run's flags, world and workload into its plan
(``register``); its plan class answers the hooks of ``DegreePlan`` (defaults below). The run path loops over
the plans through ``Mesh``: it never names a degree. Which degrees compose at all is the legality table's
(``ds_bench.config.degrees.pairs``), checked before any plan is resolved.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

from ds_bench.engines.degrees.data_parallel import DataParallel

Resolver = Callable[..., object]
"""``(cfg, workload, world_size, local_world_size) -> plan | None``: a degree's plan for the run, before joining."""

RESOLVERS: dict[str, Resolver] = {}
"""Degree field (``ds_bench.config.degrees``) -> its engine module's resolver, in registration order."""


def register(field: str):
    """The decorator a degree's engine module puts on its resolver."""
    def add(resolver: Resolver) -> Resolver:
        RESOLVERS[field] = resolver
        return resolver
    return add


class DegreePlan:
    """The hooks a degree's plan answers, with what a degree that does nothing there returns. A plan is a frozen
    dataclass with a ``size``; ``field`` names its degree."""

    field: ClassVar[str]
    splits_replica: ClassVar[bool] = True
    """The ranks of one of its groups read one data replica's batch (pipeline, AutoTP, Ulysses); False: every
    rank reads its own (experts)."""
    builds_stages: ClassVar[bool] = False
    """The model is built as stages and the engine trains a whole step per call (the pipeline)."""
    shards_layers: ClassVar[bool] = False
    """The engine shards the model's layers inside ``deepspeed.initialize`` (AutoTP): a rank's parameters are
    counted after it."""
    comm_timed: ClassVar[bool] = False
    """Its own collectives are timed (``ds_bench.measure.layout_comm.TIMED[field]``)."""
    routes_tokens: ClassVar[bool] = False
    """It routes tokens to experts: the record's block has their load balance (``ds_bench.measure.expert_load``)."""

    def with_config(self, ds_cfg: dict):
        """The plan once the resolved DeepSpeed config is known."""
        return self

    def deepspeed_config(self, ds_cfg: dict) -> dict:
        """``ds_cfg`` with this degree's keys, as ``deepspeed.initialize`` gets it (pure)."""
        return ds_cfg

    def record_settings(self) -> dict:
        """What the record's block says of the degree beyond its size."""
        return {}

    def prepare(self, workload, rank: int) -> None:
        """Before the model is built on this rank."""

    def whole_params(self, model, numel) -> int | None:
        """The whole model's parameters from this rank's, where the rank holds a share of them; None: it holds all."""
        return None

    def rank_params_held(self, model, numel) -> dict | None:
        """The record's ``build.rank_params_held``: what this rank holds, by part; None: nothing to say."""
        return None

    def mpu(self, model, micro_batch: int, workload):
        """The model-parallel groups ``deepspeed.initialize`` gets (after joining, before it), or None."""
        return None

    def staged_batches(self, workload, engine, micro_batch: int) -> Iterator:
        """A staged model's batches (``builds_stages``), from the engine's own grid."""
        raise NotImplementedError

    shards_batches: ClassVar[bool] = False
    """``shard`` gives each rank a slice of its replica's batches (Ulysses)."""

    def shard(self, batches: Iterator, rank: int) -> Iterator:
        """This rank's part of its replica's batches."""
        return batches

    def verdict_terms(self, workload, micro_batch: int, comm: dict | None, build: dict) -> dict:
        """Its collectives' keywords of the comm-bound verdict (``ds_bench.perf.comm_bound.for_run``)."""
        return {}


@dataclass(frozen=True)
class Mesh:
    """The active degrees' plans over ``world_size`` ranks, in registration order."""

    world_size: int
    plans: tuple = ()

    @property
    def staged(self):
        """The plan that builds the model as stages, or None."""
        return next((p for p in self.plans if p.builds_stages), None)

    @property
    def data_parallel(self) -> DataParallel:
        """The replicas the degrees leave: the world over the product of those whose groups share one."""
        group = math.prod(p.size for p in self.plans if p.splits_replica)
        return DataParallel(self.world_size // group, group)

    @property
    def data_parallel_size(self) -> int:
        return self.data_parallel.size

    @property
    def shards_layers(self) -> bool:
        return any(p.shards_layers for p in self.plans)

    @property
    def shards_batches(self) -> bool:
        return any(p.shards_batches for p in self.plans)

    def with_config(self, ds_cfg: dict) -> Mesh:
        return dataclasses.replace(self, plans=tuple(p.with_config(ds_cfg) for p in self.plans))

    def deepspeed_config(self, ds_cfg: dict) -> dict:
        for plan in self.plans:
            ds_cfg = plan.deepspeed_config(ds_cfg)
        return ds_cfg

    def record_blocks(self) -> dict[str, dict] | None:
        """The record's ``degrees`` map: each active degree's size and settings (``ds_bench.record.run_blocks``)."""
        return {p.field: {"size": p.size, "settings": p.record_settings() or None} for p in self.plans} or None

    def prepare(self, workload, rank: int) -> None:
        for plan in self.plans:
            plan.prepare(workload, rank)

    def whole_params(self, model, numel) -> int:
        counts = (p.whole_params(model, numel) for p in self.plans)
        return next((n for n in counts if n is not None), None) or sum(numel(p) for p in model.parameters())

    def rank_params_held(self, model, numel) -> dict | None:
        return next((h for h in (p.rank_params_held(model, numel) for p in self.plans) if h is not None), None)

    def mpu(self, model, micro_batch: int, workload):
        return next((m for m in (p.mpu(model, micro_batch, workload) for p in self.plans) if m is not None), None)

    def batches(self, workload, rank: int, micro_batch: int) -> Iterator:
        """This rank's batches: its data replica's (groups of consecutive ranks share one), each degree's part of
        them. A staged model's batches are its plan's (``staged_batches``)."""
        stream = self.data_parallel.batches(workload, rank, micro_batch)
        for plan in self.plans:
            stream = plan.shard(stream, rank)
        return stream

    def verdict_terms(self, workload, micro_batch: int, comm: dict[str, dict | None], build: dict) -> dict:
        terms = {}
        for plan in self.plans:
            terms.update(plan.verdict_terms(workload, micro_batch, comm.get(plan.field), build))
        return terms


def resolve(cfg, workload, world_size: int, local_world_size: int | None) -> Mesh:
    """Every registered degree's plan for the run (``RESOLVERS``), those that are active, as one mesh."""
    plans = (resolver(cfg, workload, world_size, local_world_size) for resolver in RESOLVERS.values())
    return Mesh(world_size, tuple(p for p in plans if p is not None))
