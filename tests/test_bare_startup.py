"""tools/bare_startup.py: the hand-written DeepSpeed script it times runs on 2 real ranks and reports its
seconds to the first measured step (the comparison itself is a benchmark command, not a test)."""

import json
import os
import sys

import pytest

from tests.conftest import REPO, explain, run_cmd


@pytest.mark.dist
@pytest.mark.full  # its stock DeepSpeed compiles the shm op once in the environment's folder (~30 s)
def test_the_bare_script_reports_its_time_to_the_first_measured_step():
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = run_cmd([torchrun, "--nproc_per_node", "2", "--master_port", "29969", str(REPO / "tools" / "bare_startup.py"),
                    "--rank", "--warmup", "2"], timeout=600)
    assert proc.returncode == 0, explain(proc)
    (line,) = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith('{"bare_s"')]
    assert 0 < line["bare_s"] < 300
