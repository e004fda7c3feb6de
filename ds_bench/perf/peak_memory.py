"""A layout's peak memory per rank, predicted from measured runs of the same split of the model, and whether
it fits (pure): the sweep's prediction (``MemoryModel``, ``sweep --prune``) and capacity's next size
(``calibrate`` and ``predict_peak_bytes`` on a search's first probe).

prediction = baseline + model states(point) + activations(point) [+ fixed, from two runs]

- **baseline**: what a rank held before the model was built (record ``baseline_mem_bytes``:
  runtime, libraries, process group; ``ds_bench.run.main`` preloads the libraries every stage imports).
- **model states**: ``perf.states.model_states_bytes`` (the ZeRO paper's formulas and DeepSpeed's own
  estimators, by stage, precision, offload and degree).
- **activations**: scaled from one measured small-micro-batch run (``calibrate``):
  per sample = (peak - baseline - model states of that run) / micro-batch, floored at 0, times
  micro-batch and the ratio of element sizes (fp32 4, bf16/fp16 2). This is linear in micro-batch,
  which holds for activations, their gradients and logits (measured on 2 CPU ranks, fp32: mnist
  0.8-1.2 MiB/sample between micro-batches 8, 32 and 128, GPT-2 tiny 81 MiB/sample), and is wrong
  where memory does not scale with it: a fixed cost the first step pays (kernels' code pages,
  allocator arenas, buffers) is read as per-sample memory and over-predicts larger micro-batches
  (mnist from 8 to 128: 1.8x the measured peak; GPT-2 tiny from 2 to 8: 1.25x); the peak of a big
  model may be the initialization transient (flattening copies), not the step; activation
  checkpointing and attention kernels whose memory is not linear in batch are not modelled.
  Given a second run of the same family at another micro-batch (``second=``), the slope is the
  per-sample figure and the intercept the fixed cost (the same points: 0.91-1.0x). The element
  size ratio is wrong for memory kept in fp32 whatever the precision: Hugging Face's causal-LM
  loss upcasts the logits (transformers/loss/loss_utils.py), so GPT-2 tiny in bf16 measured 0.93x
  its fp32 activations, not 0.5x, and an fp32 calibration predicted 0.77-0.86x of its bf16 peaks:
  calibrate on a point of the same precision where the sweep has one.

``MemoryModel`` is what a sweep knows of its points' memory: calibrated on the first ok point (model size,
baseline, activations), again once a second micro-batch of that point's family ran ok (two peaks separate the
fixed per-step cost from the per-sample one: ``calibrate``), and predicting every later point's peak from that;
each split of the model (its parallel degrees), each sequence length (a ``--seq-len`` axis) and each set of
memory options (``--tiled-mlp``, ``--tiled-loss``) calibrated on its own points: activations per sample are
their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ds_bench.config.layout import SWITCHES, Layout
from ds_bench.perf.states import ELEMENT_BYTES, ModelShape, model_states_bytes, models
from ds_bench.record.schema import RunMetrics, RunRecord, SweepPointRecord


@dataclass(frozen=True)
class Calibration:
    """What one measured run (or two of one family) says beyond the model states."""

    baseline_bytes: int
    activation_bytes_per_sample: float
    precision: str
    fixed_bytes: int = 0
    """Memory that does not scale with micro-batch, beyond the baseline: 0 from one run."""
    source: str = ""
    """The key(s) of the point(s) it was measured on."""


def calibrate(record: RunRecord | None, point: Layout, world_size: int, ranks_per_node: int, device_type: str,
              second: tuple[RunRecord, Layout] | None = None, expert_params: int = 0) -> Calibration | None:
    """The calibration from an ``ok`` run record of ``point``; None when it cannot give one.

    ``second``: an ``ok`` record of the same family at another micro-batch; then the per-sample
    figure is the slope between the two peaks and the rest above the model states is fixed.
    ``expert_params``: the experts' of the record's parameters (``ModelShape.expert_params``)."""
    measured = _measured(record, expert_params)
    if measured is None or point.micro_batch <= 0:
        return None
    peak, baseline, shape = measured
    states = model_states_bytes(shape, point, world_size, ranks_per_node, device_type)
    above = peak - baseline - states
    other = _measured(second[0], expert_params) if second else None
    if other is None or second[1].family != point.family or second[1].micro_batch == point.micro_batch:
        return Calibration(baseline, max(0.0, above / point.micro_batch), point.precision, source=point.key)
    slope = max(0.0, (other[0] - peak) / (second[1].micro_batch - point.micro_batch))
    fixed = max(0, int(above - slope * point.micro_batch))
    return Calibration(baseline, slope, point.precision, fixed, source=f"{point.key}; {second[1].key}")


def _measured(record: RunRecord | None, expert_params: int = 0) -> tuple[int, int, ModelShape] | None:
    if record is None or record.status != "ok":
        return None
    m = record.metrics
    if None in (record.params, record.largest_layer_params, m.peak_mem_bytes, m.baseline_mem_bytes):
        return None  # a record from before these fields existed
    return m.peak_mem_bytes, m.baseline_mem_bytes, ModelShape(record.params, record.largest_layer_params, expert_params)


def predict_peak_bytes(shape: ModelShape, point: Layout, world_size: int, ranks_per_node: int,
                       device_type: str, calibration: Calibration | None) -> int | None:
    """Peak memory of one rank for ``point``, in bytes; None without a calibration."""
    if calibration is None:
        return None
    states = model_states_bytes(shape, point, world_size, ranks_per_node, device_type)
    scale = ELEMENT_BYTES[point.precision] / ELEMENT_BYTES[calibration.precision]
    activations = calibration.activation_bytes_per_sample * point.micro_batch * scale
    return int(calibration.baseline_bytes + calibration.fixed_bytes + states + math.ceil(activations))


def fits(predicted: int | None, capacity: int, headroom_pct: float) -> bool:
    """Whether a predicted peak leaves ``headroom_pct`` percent of ``capacity`` free. No prediction
    fits: only a run can tell."""
    if not 0 <= headroom_pct < 100:
        raise ValueError(f"headroom_pct must be in [0, 100), got {headroom_pct}")
    return predicted is None or predicted <= capacity * (1 - headroom_pct / 100)


class MemoryModel:
    """One calibration per split of the model (``Layout.degrees``): a TP rank, for one, holds its share of the
    model states and runs the whole micro-batch through sharded layers, so its activations per sample are
    its own. Only layouts the model states are modelled for are predicted (``perf.states.models``)."""

    def __init__(self, world: int, per_node: int, device_type: str, capacity: int, expert_params: int = 0):
        """``expert_params``: the experts' of the model's parameters (``Workload.expert_param_count``; 0: dense),
        which an expert-parallel point holds 1/EP of (``perf.states.expert_parallel_groups``)."""
        self.world, self.per_node, self.device_type, self.capacity = world, per_node, device_type, capacity
        self.expert_params = expert_params
        self.fits: dict[tuple, _Fit] = {}

    def learn_from(self, records) -> None:
        """Calibrate on the ok points of layouts the model predicts (``perf.states.models``)."""
        for r in records:
            layout = Layout.from_dict(r.point)
            if not r.params or r.peak_mem_bytes is None or not models(layout):
                continue
            fit = self.fits.setdefault(_split(layout), _Fit())
            fit.learn(r, self.world, self.per_node, self.device_type, self.expert_params)

    def predict(self, point: Layout) -> int | None:
        fit = self.fits.get(_split(point))
        if fit is None or fit.calibration is None or not models(point):
            return None
        return predict_peak_bytes(fit.shape, point, self.world, self.per_node, self.device_type, fit.calibration)

    def surely_too_big(self, predicted: int | None, point: Layout) -> bool:
        """Calibrated on two micro-batches the prediction came within 0.91-1.00x of the measured
        peak; on one, 1.2-1.8x high (it counts the step's fixed cost as per-sample), so then only a
        prediction over twice the capacity skips a point (measured: the module docstring)."""
        if predicted is None:
            return False
        fit = self.fits.get(_split(point))
        return predicted > self.capacity * (1 if fit and fit.two_point else 2)


class _Fit:
    """The calibration of one split of the model: on its first ok point, again once a second
    micro-batch of that point's family ran ok."""

    def __init__(self):
        self.shape: ModelShape | None = None
        self.calibration: Calibration | None = None
        self.ok_points: list[SweepPointRecord] = []
        self.two_point = False

    def learn(self, r: SweepPointRecord, world: int, per_node: int, device_type: str, expert_params: int = 0) -> None:
        self.ok_points.append(r)
        first = self.ok_points[0]
        same_family = [x for x in self.ok_points[1:] if x.point | {"micro_batch": 0} == first.point | {"micro_batch": 0}
                       and x.point["micro_batch"] != first.point["micro_batch"]]
        if self.calibration is None or (same_family and not self.two_point):
            self.shape = ModelShape(first.params, first.largest_layer_params or 0, expert_params)
            second = (_as_run(same_family[0]), Layout.from_dict(same_family[0].point)) if same_family else None
            self.calibration = calibrate(_as_run(first), Layout.from_dict(first.point), world, per_node,
                                                 device_type, second=second, expert_params=expert_params)
            self.two_point = second is not None


def _split(layout: Layout) -> tuple:
    """What a calibration is shared by (the module docstring): the degrees, and the sequence and switches where
    a sweep varies them (a sweep without leaves the key as it was)."""
    seq = (("seq_len", layout.seq_len),) if layout.seq_len else ()
    return tuple(sorted(layout.degrees().items())) + seq + tuple(s.key_word(getattr(layout, s.field)) for s in SWITCHES
                                                                 if getattr(layout, s.field))


def _as_run(point_record: SweepPointRecord) -> RunRecord:
    """The fields of a run record that ``calibrate`` reads, from a point record."""
    return RunRecord(workload=point_record.workload or "", status="ok", params=point_record.params,
                     largest_layer_params=point_record.largest_layer_params,
                     metrics=RunMetrics(peak_mem_bytes=point_record.peak_mem_bytes,
                                        baseline_mem_bytes=point_record.baseline_mem_bytes or 0))
