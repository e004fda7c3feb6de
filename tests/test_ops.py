"""The first-run notice about DeepSpeed's JIT-compiled CPU ops."""

import logging

from ds_bench import ops


def test_missing_ops_are_announced_before_the_silence(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(logging.getLogger("ds_bench"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="ds_bench"):
        ops.announce_cpu_builds("cpu", "cpu_adam")
    assert "first run on this machine: DeepSpeed compiles deepspeed_shm_comm, cpu_adam" in caplog.text
    assert str(tmp_path) in caplog.text


def test_built_ops_and_gpus_are_quiet(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    (tmp_path / "deepspeed_shm_comm").mkdir()
    (tmp_path / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").write_bytes(b"")
    monkeypatch.setattr(logging.getLogger("ds_bench"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="ds_bench"):
        ops.announce_cpu_builds("cpu", None)
        ops.announce_cpu_builds("cuda", "fused_adam")
    assert caplog.text == ""
