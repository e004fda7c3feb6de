"""The top-level keys DeepSpeed reads, from its source (``ds_bench.config.deepspeed.ds_reads``): the scanner
on inline functions, then the whole walk against the keys a real ``DeepSpeedConfig`` touches."""

from __future__ import annotations

import pytest

from ds_bench.config.deepspeed.ds_reads import scan, top_level_keys
from ds_bench.config.deepspeed.prepare import unknown_keys

CONSTANTS = {"TRAIN_BATCH_SIZE": "train_batch_size", "FP16": "fp16", "TABLE": {"nebula": "gone", "amp": "gone"}}


def test_scan_reads_the_four_ways_deepspeed_reads_a_key():
    source = '''
def read(param_dict):
    a = get_scalar_param(param_dict, TRAIN_BATCH_SIZE, 1)
    b = param_dict.get("steps_per_print", 10)
    if FP16 in param_dict.keys():
        c = param_dict["fp16"]
    if "aio" not in param_dict:
        pass
    open(param_dict, "r")
'''
    keys, calls = scan(source, ("param_dict",), CONSTANTS.get)
    assert keys == {"train_batch_size", "steps_per_print", "fp16", "aio"}  # open(..., "r") reads no key
    assert calls == [("get_scalar_param", 0), ("open", 0)]


def test_scan_follows_aliases_loops_and_the_calls_handing_the_config_on():
    source = '''
def __init__(self, config):
    self._param_dict = config
    param_dict = copy.copy(self._param_dict)
    for key, message in TABLE.items():
        if key in param_dict:
            raise ValueError(message)
    for key in ("x", "y"):
        if key in other:
            pass
    monitors = {k: param_dict.get(k, {}) for k in ("wandb", "comet")}
    self._initialize_params(param_dict)
    get_zero_config(param_dict)
'''
    keys, calls = scan(source, ("config",), CONSTANTS.get)
    assert keys == {"nebula", "amp", "wandb", "comet"}  # "x", "y" are looked up in another dict
    assert calls == [("self._initialize_params", 0), ("get_zero_config", 0)]


def test_a_default_argument_names_a_key():
    source = '''
def get_type(param_dict, comm_type=TRAIN_BATCH_SIZE):
    return get_scalar_param(param_dict, comm_type, None)
'''
    lookup = {"comm_type": "communication_data_type"}.get
    assert scan(source, ("param_dict",), lookup)[0] == {"communication_data_type"}


class Recording(dict):
    """A config that notes every top-level key DeepSpeed looks at."""

    def __init__(self, data, seen):
        super().__init__(data)
        self.seen = seen

    def __copy__(self):
        return Recording(self, self.seen)

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.seen.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.seen.add(key)
        return super().__contains__(key)

    def keys(self):
        outer = self

        class Keys(list):
            def __contains__(self, key):
                return key in outer

        return Keys(super().keys())


def test_every_key_a_real_deepspeed_config_reads_is_known(monkeypatch):
    """Independent of the scan: build DeepSpeed's own ``DeepSpeedConfig`` from a recording dict, as rank 0
    of 2 (so its world-size branch, which reads ``sequence_parallel_size``, runs), and every key it looked at
    must be known. A DeepSpeed that starts reading a key the scan misses fails here."""
    import deepspeed.comm as dist
    from deepspeed.runtime.config import DeepSpeedConfig

    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
    seen: set[str] = set()
    DeepSpeedConfig(Recording({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 1}, seen))
    assert {"sequence_parallel_size", "zero_optimization", "bf16", "bfloat16", "tensor_parallel"} <= seen
    assert seen - top_level_keys() == set()


def test_deepspeed_initialize_s_own_reads_are_known():
    """``deepspeed.initialize`` reads a mesh from ``sequence_parallel_size`` with ``data_parallel_size``."""
    assert {"sequence_parallel_size", "data_parallel_size", "tensor_parallel"} <= top_level_keys()


@pytest.mark.parametrize("key", ["sequence_parallel_size", "managed_gradient_accumulation", "datastates_ckpt"])
def test_keys_the_old_hand_list_lacked_are_not_called_unknown(key):
    assert unknown_keys({key: 1}) == []


@pytest.mark.parametrize("key, hint", [("zenflow", None), ("load_universal_checkpoint", None),
                                       ("steps_per_prnt", "steps_per_print")])
def test_keys_deepspeed_reads_only_inside_a_section_are_unknown_at_the_top(key, hint):
    """zenflow is read inside zero_optimization, load_universal inside checkpoint: at the top DeepSpeed drops them."""
    found = unknown_keys({key: 1})
    assert found == [key + (f" (did you mean {hint}?)" if hint else "")]


@pytest.mark.parametrize("scan", ["raises", "partial"])
def test_a_scan_that_fails_or_misses_core_keys_checks_nothing_rather_than_refusing_valid_keys(monkeypatch, scan):
    """A DeepSpeed whose source the scanner trips on, or which reads its config another way, must not make every
    run fail or call valid keys unknown: the top level then goes unchecked."""
    from ds_bench.config.deepspeed import ds_reads

    def fake():
        if scan == "raises":
            raise IndentationError("unexpected indent")
        return frozenset({"train_batch_size", "zenflow"})

    monkeypatch.setattr(ds_reads, "_scan_installed", fake)
    ds_reads.top_level_keys.cache_clear()
    try:
        assert ds_reads.top_level_keys() == frozenset()
    finally:
        ds_reads.top_level_keys.cache_clear()
