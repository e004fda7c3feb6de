"""ds-bench doctor: version agreement (pure) and a real 2-rank report under torchrun."""

import pytest

from ds_bench.comm.doctor import ceiling_lines, leftover_notes, version_problems
from tests.conftest import ds_bench, explain, run_cmd


def test_version_disagreement_names_the_ranks():
    facts = [{"rank": 0, "versions": {"torch": "2.1", "deepspeed": "0.19"}},
             {"rank": 1, "versions": {"torch": "2.2", "deepspeed": "0.19"}}]
    assert version_problems(facts) == ["torch differs across ranks: {0: '2.1', 1: '2.2'}"]
    assert version_problems(facts[:1]) == []


@pytest.mark.dist
@pytest.mark.full  # doctor runs for real across two hosts in tests/test_netns.py
def test_doctor_under_torchrun_reports_every_rank_and_a_correct_all_reduce():
    proc = run_cmd(["torchrun", "--nproc_per_node", "2", "--master_port", "29760", "-m", "ds_bench", "doctor",
                    "--iface", "lo"], timeout=180)
    assert proc.returncode == 0, explain(proc)
    out = proc.stdout
    assert "launcher: torchrun" in out and "all_reduce: correct" in out and "busbw" in out
    assert "OK: ranks agree on versions and all_reduce works" in out
    assert "GLOO_SOCKET_IFNAME=lo" in out
    assert sum(line.startswith("|      ") and "lo (127.0.0.1)" in line for line in out.splitlines()) == 2
    for rank in (0, 1):  # each rank's short ceiling: bf16 and fp32 matmul, a copy
        (line,) = [x for x in out.splitlines() if x.startswith(f"ceiling rank {rank} ")]
        assert "matmul bf16 n=512" in line and "matmul fp32 n=512" in line and "GB/s" in line, line


def test_ceiling_lines_give_each_rank_its_figures():
    rows = [{"rank": r, "device": "x86_64", "test": "matmul", "dtype": "fp32", "size": 512, "median": 0.09 + r}
            for r in (1, 0)] + [{"rank": 0, "device": "x86_64", "test": "copy", "dtype": "fp32", "size": 8, "median": 29.0}]
    assert ceiling_lines(rows) == ["ceiling rank 0 (x86_64): matmul fp32 n=512 0.09 TFLOP/s, copy 29 GB/s",
                                   "ceiling rank 1 (x86_64): matmul fp32 n=512 1.09 TFLOP/s"]


def test_leftover_shm_buffers_are_one_note_per_host():
    facts = [{"host": "a", "shm_leftovers": [2, 3 * 2**29]}, {"host": "a", "shm_leftovers": [2, 3 * 2**29]},
             {"host": "b", "shm_leftovers": [0, 0]}]
    (note,) = leftover_notes(facts)
    assert note.startswith("NOTE: a: 2 leftover DeepSpeed shm buffer(s) hold 1.50 GiB of RAM in /dev/shm")


def test_doctor_with_a_missing_interface_is_a_one_line_error():
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29761"}
    proc = ds_bench("doctor", "--iface", "nosuchif0", timeout=120, **env)
    assert proc.returncode == 2, explain(proc)
    assert proc.stderr.startswith("ds-bench: error: interface 'nosuchif0'") and "Traceback" not in proc.stderr
    assert "interfaces present: " in proc.stderr
