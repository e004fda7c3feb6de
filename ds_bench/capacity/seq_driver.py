"""One layout's ``--scale seq`` search: probe the model at sequence lengths until the longest that trains is known.

The probes, records, ledger and summary are ``capacity.driver.LayoutSearch``'s; a member is the model at one
length (``capacity.family.seq_member``: ``seq 8192``, made when the search asks for it) and a probe's index is
that length. The policy is ``capacity.seq_search`` (double from ``--seq-len``, then bisect); the prediction
``perf.seq_memory`` (the model states, the measured baseline, activations per token and the loss's
[tokens x vocabulary] tensors), calibrated on this layout's ok probes. A length predicted above
``TOO_BIG_FACTOR`` x the memory is not run (``predicted``); a layout ``perf.states`` does not model (a
pipeline) is only run.
"""

from __future__ import annotations

from functools import lru_cache

from ds_bench.capacity import search, seq_search
from ds_bench.capacity.driver import TOO_BIG_FACTOR, LayoutSearch
from ds_bench.capacity.family import Member, seq_member
from ds_bench.jobs import ledger
from ds_bench.perf import seq_memory
from ds_bench.perf.states import ModelShape, model_states_bytes, models


class SeqSearch(LayoutSearch):
    def run(self) -> search.Answer:
        lengths = self.spec.lengths
        known = {t: r.status for t, r in self.probes.items() if r.status in ledger.FINAL}
        self._calibrate()
        while (t := seq_search.next_length(lengths, known)) is not None:
            predicted = self.predict(self.member(t)) if self.spec.prune else None
            if predicted is not None and predicted > TOO_BIG_FACTOR * self.capacity:
                known[t] = search.PREDICTED
                continue
            known[t] = self._probe(t).status
            self._calibrate()
        return seq_search.answer(lengths, known)

    def member(self, i: int) -> Member:
        """The model at sequence length ``i``."""
        return _seq_member(self.spec.workload, self.spec.members[0].run_args, i, self.spec.router)

    def _calibrate(self) -> None:
        if not models(self.layout):
            return
        experts = self.spec.members[0].expert_params  # the same model at every length
        probes = [seq_memory.SeqProbe(t, r.peak_mem_bytes, r.baseline_mem_bytes, self._states(
            ModelShape(r.params, r.largest_layer_params, experts))) for t, r in self.probes.items()
            if r.status == "ok" and None not in (r.peak_mem_bytes, r.baseline_mem_bytes, r.params,
                                                 r.largest_layer_params)]
        self.calibration = seq_memory.calibrate(probes, self.layout, self.spec.members[0].vocab)

    def predict(self, m: Member) -> int | None:
        if self.calibration is None:
            return None
        states = self._states(ModelShape(m.params, m.largest_layer_params, m.expert_params))
        return seq_memory.predict_peak(self.calibration, self.layout, m.seq_len, m.vocab, states)

    def _states(self, shape: ModelShape) -> int:
        return model_states_bytes(shape, self.layout, self.world, self.per_node, self.spec.device_type)


@lru_cache(maxsize=256)
def _seq_member(workload: str, model: tuple[str, ...], seq_len: int, router: tuple = (None, None)) -> Member:
    return seq_member(workload, model, seq_len, router)
