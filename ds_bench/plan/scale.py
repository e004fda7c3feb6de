"""``ds-bench plan --scale layers|hidden|seq``: the plan's other two questions at N GPUs, the largest model and
the longest sequence each layout trains (``perf.scale``), ranked with their throughput there. The family's members
are built as ``ds-bench run`` would build them (``resizer``), so ``--confirm`` runs an answer as the plan modelled
it (``answer_args``)."""

from __future__ import annotations

import dataclasses

from ds_bench.errors import UserError
from ds_bench.perf import scale as perf_scale
from ds_bench.perf import shapes
from ds_bench.perf.devices import Cluster
from ds_bench.perf.shapes import Transformer
from ds_bench.perf.space import Dropped, Space, screen
from ds_bench.plan.spec import PlanSpec
from ds_bench.record.plan_schema import ScaledTo

GiB = 1024 ** 3


def custom(spec: PlanSpec) -> bool:
    """Whether the model is given as ``--layers --hidden --heads`` (a custom shape ``ds-bench run`` rebuilds)."""
    return all(spec.shape_flags.get(k) for k in ("layers", "hidden", "heads"))


def resizer(spec: PlanSpec, base: Transformer) -> perf_scale.Resize:
    """A member of ``base``'s family at ``value`` along an axis: more blocks; a wider model with the head width
    kept (a custom shape rebuilt as ``ds-bench run --hidden H --heads H/d`` builds it; a named size with its KV
    heads and MLP width scaled in proportion, the MLP in multiples of 256)."""

    def resize(shape: Transformer, axis: str, value: int) -> Transformer:
        if axis == "layers":
            return dataclasses.replace(shape, layers=value, label=f"{base.label} L{value}")
        heads = value // shape.head_dim
        if custom(spec):
            built = shapes.of_workload(spec.workload, None, shape.layers, value, heads, spec.seq_len,
                                       spec.shape_flags["experts"], spec.shape_flags["top_k"])
            return dataclasses.replace(built, dropout=shape.dropout, norm_kernel=shape.norm_kernel)
        ffn = 4 * value if shape.mlp == "gelu" else 256 * max(1, round(shape.ffn * value / shape.hidden / 256))
        return dataclasses.replace(shape, hidden=value, heads=heads, kv_heads=max(1, heads * shape.kv_heads // shape.heads),
                                   ffn=ffn, label=f"{base.label} h{value}")

    return resize


def answers(spec: PlanSpec, shape: Transformer, cluster: Cluster, space: Space, workload_cls,
            run_options: frozenset[str]) -> tuple[list[perf_scale.Scaled], list[Dropped]]:
    """Every legal candidate's largest member along ``spec.scale`` (best first), and the candidates dropped before
    (legality, model, batch: ``perf.space.screen``); a ``UserError`` when no layout holds even the smallest."""
    kept, dropped = screen(shape, cluster, space, spec.seq_len, spec.sequences, workload_cls, run_options)
    out = perf_scale.scale(shape, kept, cluster, space, spec.scale, spec.seq_len, spec.sequences, workload_cls,
                           resizer(spec, shape))
    if kept and not out:
        unit = {"layers": "a pipeline's worth of blocks", "hidden": "one step of heads",
                "seq": f"{perf_scale.SEQ_STEP} tokens x SP"}[spec.scale]
        raise UserError(f"--scale {spec.scale}: no layout on {cluster.nodes} x {cluster.per_node} {cluster.device} "
                        f"holds {shape.label} at {unit} ({cluster.memory_bytes / GiB:.1f} GiB per device); more "
                        "devices, offload or another --scale")
    return out, dropped


def scaled_to(answer: perf_scale.Scaled) -> ScaledTo:
    s = answer.shape
    return ScaledTo(axis=answer.axis, value=answer.value, params=s.params, layers=s.layers, hidden=s.hidden,
                    heads=s.heads, seq_len=answer.seq_len, sequences=answer.sequences, capped=answer.capped)


def answer_args(spec: PlanSpec, s: ScaledTo) -> list[str] | None:
    """The ``ds-bench run`` flags that build an answer's member: the plan's model as given (its size and shape
    flags, the router's included) at the answer's ``--seq-len`` (``--scale seq``), or its custom shape
    (``--scale layers|hidden``); None for a named size's larger member, which no ``ds-bench run`` flag builds."""
    if s.axis == "seq":
        return spec.model_flags(s.seq_len)
    if not custom(spec):
        return None
    return ["--layers", str(s.layers), "--hidden", str(s.hidden), "--heads", str(s.heads),
            *spec.model_flags(s.seq_len, names=("experts", "top_k"))]
