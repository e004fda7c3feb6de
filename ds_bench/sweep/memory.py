"""What the sweep knows of its points' memory: calibrated on the first ok point (model size, baseline,
activations), again once a second micro-batch of that point's family ran ok (two peaks separate
the fixed per-step cost from the per-sample one: ``jobs.predict.calibrate``), and predicting every
later point's peak from that; each split of the model (its parallel degrees), each sequence length (a
``--seq-len`` axis) and each set of memory options (``--tiled-mlp``, ``--tiled-loss``) calibrated on its own points:
activations per sample are their own.
"""

from __future__ import annotations

from ds_bench.config.layout import SWITCHES, Layout
from ds_bench.jobs import predict
from ds_bench.record.schema import RunMetrics, RunRecord, SweepPointRecord


class MemoryModel:
    """One calibration per split of the model (``Layout.degrees``): a TP rank, for one, holds its share of the
    model states and runs the whole micro-batch through sharded layers, so its activations per sample are
    its own. Only layouts ``jobs.predict`` models are predicted (``predict.models``)."""

    def __init__(self, world: int, per_node: int, device_type: str, capacity: int, expert_params: int = 0):
        """``expert_params``: the experts' of the model's parameters (``Workload.expert_param_count``; 0: dense),
        which an expert-parallel point holds 1/EP of (``jobs.predict.expert_parallel_groups``)."""
        self.world, self.per_node, self.device_type, self.capacity = world, per_node, device_type, capacity
        self.expert_params = expert_params
        self.fits: dict[tuple, _Fit] = {}

    def learn_from(self, records) -> None:
        """Calibrate on ok points of layouts ``jobs.predict`` models."""
        for r in records:
            layout = Layout.from_dict(r.point)
            if not r.params or r.peak_mem_bytes is None or not predict.models(layout):
                continue
            fit = self.fits.setdefault(_split(layout), _Fit())
            fit.learn(r, self.world, self.per_node, self.device_type, self.expert_params)

    def predict(self, point: Layout) -> int | None:
        fit = self.fits.get(_split(point))
        if fit is None or fit.calibration is None or not predict.models(point):
            return None
        return predict.predict_peak_bytes(fit.shape, point, self.world, self.per_node, self.device_type, fit.calibration)

    def surely_too_big(self, predicted: int | None, point: Layout) -> bool:
        """Calibrated on two micro-batches the prediction came within 0.91-1.00x of the measured
        peak; on one, 1.2-1.8x high (it counts the step's fixed cost as per-sample), so then only a
        prediction over twice the capacity skips a point (measured: ``ds_bench.jobs.predict``)."""
        if predicted is None:
            return False
        fit = self.fits.get(_split(point))
        return predicted > self.capacity * (1 if fit and fit.two_point else 2)


class _Fit:
    """The calibration of one split of the model: on its first ok point, again once a second
    micro-batch of that point's family ran ok."""

    def __init__(self):
        self.shape: predict.ModelShape | None = None
        self.calibration: predict.Calibration | None = None
        self.ok_points: list[SweepPointRecord] = []
        self.two_point = False

    def learn(self, r: SweepPointRecord, world: int, per_node: int, device_type: str, expert_params: int = 0) -> None:
        self.ok_points.append(r)
        first = self.ok_points[0]
        same_family = [x for x in self.ok_points[1:] if x.point | {"micro_batch": 0} == first.point | {"micro_batch": 0}
                       and x.point["micro_batch"] != first.point["micro_batch"]]
        if self.calibration is None or (same_family and not self.two_point):
            self.shape = predict.ModelShape(first.params, first.largest_layer_params or 0, expert_params)
            second = (_as_run(same_family[0]), Layout.from_dict(same_family[0].point)) if same_family else None
            self.calibration = predict.calibrate(_as_run(first), Layout.from_dict(first.point), world, per_node,
                                                 device_type, second=second, expert_params=expert_params)
            self.two_point = second is not None


def _split(layout: Layout) -> tuple:
    """What a calibration is shared by (the module docstring): the degrees, and the sequence and switches where
    a sweep varies them (a sweep without leaves the key as it was)."""
    seq = (("seq_len", layout.seq_len),) if layout.seq_len else ()
    return tuple(sorted(layout.degrees().items())) + seq + tuple(s.field for s in SWITCHES if getattr(layout, s.field))


def _as_run(point_record: SweepPointRecord) -> RunRecord:
    """The fields of a run record that ``predict.calibrate`` reads, from a point record."""
    return RunRecord(workload=point_record.workload or "", status="ok", params=point_record.params,
                     largest_layer_params=point_record.largest_layer_params,
                     metrics=RunMetrics(peak_mem_bytes=point_record.peak_mem_bytes,
                                        baseline_mem_bytes=point_record.baseline_mem_bytes or 0))
