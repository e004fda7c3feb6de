"""The first-run notice about DeepSpeed's JIT-compiled CPU ops."""

import logging
import os
import sys
from pathlib import Path

import pytest

from ds_bench.machine import jit_ops, op_store
from ds_bench.machine import toolchain as machine_toolchain
from tests.conftest import BIN


def test_missing_ops_are_announced_before_the_silence(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("DS_BENCH_OP_STORE", str(tmp_path / "store"))
    monkeypatch.setattr(logging.getLogger("ds_bench"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="ds_bench"):
        jit_ops.announce_cpu_builds("cpu", "cpu_adam")
    assert "first run on this machine: DeepSpeed compiles deepspeed_shm_comm, cpu_adam" in caplog.text
    assert str(tmp_path) in caplog.text


def test_built_or_stored_ops_and_gpus_are_quiet(tmp_path, monkeypatch, caplog):
    """Built in this environment's folder (shm comm) or held by the op store (cpu_adam): no notice."""
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("DS_BENCH_OP_STORE", str(tmp_path / "store"))
    (tmp_path / "deepspeed_shm_comm").mkdir()
    (tmp_path / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").write_bytes(b"")
    stored = Path(jit_ops.stored_path(get_accelerator().create_op_builder("CPUAdamBuilder"), "cpu_adam"))
    assert stored.is_relative_to(tmp_path / "store")
    stored.parent.mkdir(parents=True)
    stored.write_bytes(b"")
    monkeypatch.setattr(logging.getLogger("ds_bench"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="ds_bench"):
        jit_ops.announce_cpu_builds("cpu", "cpu_adam")
        jit_ops.announce_cpu_builds("cuda", "fused_adam")
    assert caplog.text == ""


# --- one toolchain and one build folder per environment (pure) ---

def toolchain(env, ninja_beside=True, prefix="/work/a/.venv", versions=("2.13.0+cpu", "0.19.8"), cpu="Xeon|avx2 avx512f"):
    return machine_toolchain.toolchain_env(env, "/work/a/.venv/bin", ninja_beside, prefix, versions, "/home/u", cpu)


def test_the_ninja_beside_the_interpreter_goes_first_on_path():
    assert toolchain({"PATH": "/usr/bin:/bin"})["PATH"] == "/work/a/.venv/bin:/usr/bin:/bin"
    assert "PATH" not in toolchain({"PATH": "/work/a/.venv/bin:/usr/bin"})
    assert "PATH" not in toolchain({"PATH": "/usr/bin"}, ninja_beside=False)


def test_each_environment_builds_in_its_own_folder_unless_the_user_chose_one():
    base = toolchain({"PATH": "/usr/bin"})["TORCH_EXTENSIONS_DIR"]
    assert base.startswith("/home/u/.cache/torch_extensions/ds_bench-py")
    assert toolchain({"PATH": "/work/a/.venv/bin"})["TORCH_EXTENSIONS_DIR"] == base  # PATH does not matter
    others = {toolchain({}, prefix="/work/b/.venv")["TORCH_EXTENSIONS_DIR"],
              toolchain({}, versions=("2.13.0+cpu", "0.19.9"))["TORCH_EXTENSIONS_DIR"],
              toolchain({}, versions=("2.14.1", "0.19.8"))["TORCH_EXTENSIONS_DIR"],
              toolchain({}, ninja_beside=False)["TORCH_EXTENSIONS_DIR"],
              toolchain({}, cpu="AMD EPYC|avx2")["TORCH_EXTENSIONS_DIR"]}
    assert base not in others and len(others) == 5
    assert "TORCH_EXTENSIONS_DIR" not in toolchain({"TORCH_EXTENSIONS_DIR": "/scratch/ext"})


def test_a_native_build_is_keyed_by_the_cpu_it_targets():
    xeon = "processor\t: 0\nmodel name\t: Intel Xeon\nflags\t\t: sse avx2 avx512f\n\nprocessor\t: 1\nmodel name\t: Intel Xeon\nflags\t\t: sse avx2 avx512f\n"
    assert machine_toolchain.cpu_identity(xeon) == "Intel Xeon|avx2 avx512f sse"
    assert machine_toolchain.cpu_identity(xeon.replace(" avx512f", "")) != machine_toolchain.cpu_identity(xeon)
    assert machine_toolchain.cpu_identity("") == ""


# --- the op store: a built CPU op kept by what it is built from (pure, and tmp files) ---

KEY = dict(op_name="cpu_adam", source_digest="ab12", versions=("2.13.0+cpu", "0.19.8", "cpython-311"),
           cpu="AMD EPYC|avx2", compiler="c++ (Debian 12.2.0-14) 12.2.0")


def test_a_stored_op_is_keyed_by_everything_its_build_depends_on_and_nothing_else():
    base = op_store.op_key(**KEY)
    assert op_store.op_key(**KEY) == base  # no prefix, PATH or time in it: another checkout finds it
    changed = [{"op_name": "deepspeed_shm_comm"}, {"source_digest": "ab13"},
               {"versions": ("2.13.0+cpu", "0.19.9", "cpython-311")}, {"versions": ("2.14.1", "0.19.8", "cpython-311")},
               {"versions": ("2.13.0+cpu", "0.19.8", "cpython-312")}, {"cpu": "Intel Xeon|avx2 avx512f"},
               {"compiler": "clang version 18"}]
    keys = {op_store.op_key(**{**KEY, **change}) for change in changed}
    assert base not in keys and len(keys) == len(changed)
    assert op_store.stored_path("/s", "cpu_adam", base) == f"/s/cpu_adam-{base}/cpu_adam.so"
    assert op_store.store_root({}, "/home/u") == "/home/u/.cache/ds_bench/ops"
    assert op_store.store_root({"DS_BENCH_OP_STORE": "/scratch/ops"}, "/home/u") == "/scratch/ops"


def test_the_source_digest_reads_the_contents_of_sources_and_headers(tmp_path):
    (tmp_path / "inc" / "sub").mkdir(parents=True)
    src, header = tmp_path / "op.cpp", tmp_path / "inc" / "sub" / "op.h"
    src.write_text("int f();")
    header.write_text("#pragma once")
    (tmp_path / "inc" / "notes.txt").write_text("not compiled")
    assert op_store.headers_under([str(tmp_path / "inc"), str(tmp_path / "missing")]) == [str(header)]
    before = op_store.files_digest([str(src), str(header)])
    header.write_text("#pragma once\n#define X 1")
    assert op_store.files_digest([str(src), str(header)]) != before


def test_a_stored_op_is_written_whole_and_one_that_does_not_load_is_removed(tmp_path, caplog, monkeypatch):
    built, dest = tmp_path / "cpu_adam.so", tmp_path / "store" / "cpu_adam-k" / "cpu_adam.so"
    built.write_bytes(b"\x7fELF truncated")
    op_store.keep(str(built), str(dest))
    assert dest.read_bytes() == built.read_bytes() and os.access(dest, os.X_OK)
    assert [p.name for p in dest.parent.iterdir()] == ["cpu_adam.so"]  # no partial copy left beside it
    monkeypatch.setattr(logging.getLogger("ds_bench"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="ds_bench"):
        assert jit_ops._load_stored(object(), "cpu_adam", str(dest)) is False
    assert not dest.exists() and "does not load" in caplog.text and str(dest) in caplog.text
    assert jit_ops._load_stored(object(), "cpu_adam", str(dest)) is False  # nothing stored: build it


def test_a_lock_is_stale_only_when_old_and_nobody_builds():
    assert jit_ops.is_stale(60.0, [])
    assert not jit_ops.is_stale(60.0, [4242])
    assert not jit_ops.is_stale(1.0, [])


def test_processes_working_in_a_folder_are_found_by_their_cwd(tmp_path):
    proc, folder = tmp_path / "proc", tmp_path / "build"
    folder.mkdir()
    for pid, cwd in (("17", folder), ("18", tmp_path), ("self", folder)):
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cwd").symlink_to(cwd)
    (proc / "19").mkdir()  # a process that has gone (no cwd link)
    assert jit_ops.processes_working_in(str(folder), proc=str(proc)) == [17]


# --- real processes ---

def test_a_stale_lock_is_removed_and_a_live_build_is_waited_for(tmp_path):
    import subprocess
    import time

    lock = tmp_path / "lock"
    lock.write_text("")
    os.utime(lock, (time.time() - 60, time.time() - 60))
    builder = subprocess.Popen(["sleep", "2"], cwd=tmp_path)  # a live build works in the folder
    start = time.monotonic()
    jit_ops._clear_stale_lock(str(tmp_path), wait_s=30)
    assert time.monotonic() - start >= 1.5 and builder.poll() is not None
    assert not lock.exists()


def test_a_stale_lock_in_a_real_op_folder_does_not_hang_the_next_run(tmp_path):
    """What a build killed mid-way leaves: torch's ``lock`` file. The next load clears it.

    In a copy of this environment's op folders (TORCH_EXTENSIONS_DIR; the op itself comes from the op
    store): runs of the other test worker load the real folder meanwhile and would clear the lock first."""
    import shutil
    import time

    from tests.conftest import explain, run_cmd

    extensions = tmp_path / "torch_extensions"
    shutil.copytree(Path(op_folder("deepspeed_shm_comm")).parent, extensions, symlinks=True)
    lock = extensions / "deepspeed_shm_comm" / "lock"
    lock.write_text("")
    os.utime(lock, (time.time() - 60, time.time() - 60))
    proc = run_cmd([sys.executable, "-m", "ds_bench.machine.op_builds"], timeout=120,
                   TORCH_EXTENSIONS_DIR=str(extensions))
    assert proc.returncode == 0, explain(proc)
    assert "removed a stale build lock" in proc.stderr and str(lock) in proc.stderr
    assert not lock.exists() and "deepspeed_shm_comm: from the op store" in proc.stdout, explain(proc)


def test_a_new_environment_loads_the_stored_ops_instead_of_compiling(tmp_path):
    """A fresh build folder (what a new checkout or venv gets) and another PATH order: both CPU ops
    come from the op store, filled by ``make ops``; nothing is compiled there (a compile takes 30-60 s)."""
    from tests.conftest import explain, run_cmd

    extensions = tmp_path / "torch_extensions"
    proc = run_cmd([sys.executable, "-m", "ds_bench.machine.op_builds"], timeout=120, PATH=f"/usr/bin:/bin:{BIN}",
                   TORCH_EXTENSIONS_DIR=str(extensions))
    assert proc.returncode == 0, explain(proc)
    for name in jit_ops.CPU_OPS:
        assert f"{name}: from the op store" in proc.stdout, explain(proc)
    built = [p.name for p in extensions.rglob("*") if p.suffix in (".so", ".o", ".ninja")]
    assert built == [] and "compiling" not in proc.stderr, (built, explain(proc))


def op_folder(name):
    """The build folder ds_bench's processes use for ``name`` in this environment."""
    from tests.conftest import run_cmd

    code = ("from ds_bench.machine import environ, jit_ops; environ.pin_jit_toolchain(); "
            f"print(jit_ops.build_dir({name!r}))")
    return run_cmd([sys.executable, "-c", code], timeout=60).stdout.strip()


def test_the_optimizer_op_deepspeed_will_compile():
    off = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
    nvme = {"zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}}
    assert jit_ops.optimizer_op({**off, "optimizer": {"type": "AdamW"}}) == "cpu_adam"
    assert jit_ops.optimizer_op(off) == "cpu_adam"  # no optimizer section: ds_bench's DeepSpeedCPUAdam
    assert jit_ops.optimizer_op({**nvme, "optimizer": {"type": "Adagrad"}}) == "cpu_adagrad"
    assert jit_ops.optimizer_op({**off, "optimizer": {"type": "Lion"}}) == "cpu_lion"
    assert jit_ops.optimizer_op({"optimizer": {"type": "Adam"}}) == "fused_adam"
    assert jit_ops.optimizer_op({"optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}) is None
    assert jit_ops.optimizer_op({"optimizer": {"type": "SGD"}}) is None
    assert jit_ops.ops_for_run("cpu", "cpu_adam") == ("deepspeed_shm_comm", "cpu_adam")
    assert jit_ops.ops_for_run("cuda", None) == ()


def test_zenflows_overlapped_optimizer_process_needs_cpu_adam_built_in_the_folder():
    overlapped = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                        "zenflow": {"topk_ratio": 0.1, "overlap_step": True}}}
    assert jit_ops.spawned_process_ops(overlapped) == ("cpu_adam",)
    in_line = {"zero_optimization": {"stage": 2, "zenflow": {"topk_ratio": 0.1, "overlap_step": False}}}
    assert jit_ops.spawned_process_ops(in_line) == ()  # ZenFlow's sequential optimizer: in the rank itself
    assert jit_ops.spawned_process_ops({"zero_optimization": {"stage": 2}}) == ()
    assert jit_ops.spawned_process_ops({}) == ()


def test_a_process_loads_each_op_once_whichever_store_it_is_then_given(tmp_path):
    """A second dlopen of another copy of an op registers its torch ops again, which aborts the process
    (``TORCH_LIBRARY`` twice): it killed a pytest worker whose in-process tests reached the join with two op stores
    (a test's own ``DS_BENCH_OP_STORE``, then the user's). ``ensure_loaded`` loads an op once per process."""
    import subprocess
    import sys

    script = f"""
import os, shutil
from deepspeed.accelerator import get_accelerator
from ds_bench.machine import jit_ops
jit_ops.ensure_loaded(("deepspeed_shm_comm",))
builder = get_accelerator().create_op_builder(jit_ops.BUILDERS["deepspeed_shm_comm"])
first = jit_ops.stored_path(builder, "deepspeed_shm_comm")
os.environ["DS_BENCH_OP_STORE"] = {str(tmp_path / 'other')!r}
second = jit_ops.stored_path(builder, "deepspeed_shm_comm")
os.makedirs(os.path.dirname(second))
shutil.copy(first, second)  # the same op in another store
jit_ops.ensure_loaded(("deepspeed_shm_comm",))
print("loaded once")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "loaded once" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize("cores, builds, gib, at_once", [(2, 2, 16, False), (4, 2, 16, True), (64, 2, 16, True),
                                                         (64, 1, 16, False), (3, 2, 16, False), (64, 2, 3, False)])
def test_ops_are_built_at_once_only_where_there_are_cores_and_memory_for_every_build(cores, builds, gib, at_once):
    from ds_bench.machine.op_builds import builds_at_once

    assert builds_at_once(cores, builds, gib * 2**30) is at_once


@pytest.mark.full
def test_the_ops_built_at_once_each_by_a_process_of_its_own(tmp_path):
    """Both CPU ops compiled from nothing (an empty build folder and op store) in parallel processes, then loaded
    and stored: the path a machine with 4+ cores takes (~100 s of 2 cores here, hence the full tier)."""
    from tests.conftest import explain, run_cmd

    store = tmp_path / "store"
    proc = run_cmd([sys.executable, "-m", "ds_bench.machine.op_builds"], timeout=900, DS_BENCH_OP_BUILDS_AT_ONCE="1",
                   TORCH_EXTENSIONS_DIR=str(tmp_path / "torch_extensions"), DS_BENCH_OP_STORE=str(store))
    assert proc.returncode == 0, explain(proc)
    assert "building deepspeed_shm_comm, cpu_adam at once" in proc.stdout, explain(proc)
    assert sorted(p.stem for p in store.rglob("*.so")) == ["cpu_adam", "deepspeed_shm_comm"], explain(proc)
