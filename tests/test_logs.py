"""DeepSpeed's per-run noise is filtered by message, its other warnings still pass."""

import logging

from ds_bench.logs import DropMessages


def record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("DeepSpeed", logging.WARNING, __file__, 1, msg, None, None)


def test_scheduler_noise_is_dropped_and_other_warnings_pass():
    f = DropMessages()
    assert not f.filter(record("Attempting to get learning rate from scheduler before it has started"))
    assert f.filter(record("You are using ZeRO with an untested optimizer, proceed with caution"))
