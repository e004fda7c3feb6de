"""``--cpu-mem-limit`` in a real process (``ds_bench.machine.memory``): the cap fails an allocation the way a GPU's
memory does, the error is classified out-of-memory, and a rank that ran out keeps room to record why."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

CHILD = '''
import json, torch
from ds_bench.machine import memory

memory.cap_process_memory(memory.held_data_bytes() + 256 * 2**20)
held, error = [], None
try:
    while True:
        held.append(torch.ones(2**20 // 4))  # 1 MiB at a time, until the cap: the heap ends within 1 MiB of it
except RuntimeError as e:
    error = e

def fits(n_bytes):
    try:
        torch.ones(n_bytes // 4)
        return True
    except RuntimeError:
        return False

before = fits(16 * 2**20)
memory.lift_cap_for_record()
after = fits(16 * 2**20)
print(json.dumps({"oom": memory.is_out_of_memory(error), "held_mib": len(held), "before": before, "after": after}))
'''


def test_a_rank_at_its_cap_has_no_room_until_it_lifts_the_cap_to_record_its_failure():
    """Past an out-of-memory at 1 MiB the process cannot get 16 MiB more (what a failure record's validation and
    peers' states may need); after ``lift_cap_for_record`` it can, by at most ``RECORD_ROOM_BYTES``."""
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["oom"] and 200 <= out["held_mib"] <= 256, out
    assert (out["before"], out["after"]) == (False, True), out
