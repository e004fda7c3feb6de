"""ds_bench.machine.shm: DeepSpeed's all-reduce buffer names, and finding buffers no process maps (real mmap, real /proc).
That a real deepspeed-launcher job leaves none behind is checked on test_distributed's sweep."""

import mmap
import os

from ds_bench.machine import shm


def test_buffer_name_is_the_one_shm_cpp_builds():
    assert shm.buffer_name(0, "127.0.0.1", 29500, 1) == "deepspeed_allreduce_buffer_0_127.0.0.1_29500_1"


def _buffer(folder, port, rank, size=4096):
    path = folder / shm.buffer_name(os.getuid(), "127.0.0.1", port, rank)
    path.write_bytes(b"\0" * size)
    return path


def test_only_unmapped_buffers_are_leftovers_and_only_they_are_removed(tmp_path):
    live = _buffer(tmp_path, 1, 0)
    dead = _buffer(tmp_path, 2, 0, size=8192)
    (tmp_path / "unrelated").write_bytes(b"x")
    with open(live, "r+b") as f, mmap.mmap(f.fileno(), 4096) as mapping:
        assert mapping[0] == 0
        assert shm.leftovers(str(tmp_path)) == [shm.Leftover(str(dead), 8192)]
        assert shm.remove_leftovers(str(tmp_path)) == [shm.Leftover(str(dead), 8192)]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "unrelated"])
    assert shm.leftovers(str(tmp_path)) == [shm.Leftover(str(live), 4096)]


def test_release_unlinks_this_ranks_name_and_tolerates_its_absence(tmp_path):
    path = _buffer(tmp_path, 3, 1)
    assert shm.release_own_buffer("127.0.0.1", 3, 1, shm_dir=str(tmp_path)) is True
    assert not path.exists()
    assert shm.release_own_buffer("127.0.0.1", 3, 1, shm_dir=str(tmp_path)) is False


def test_a_missing_shm_folder_has_no_leftovers(tmp_path):
    assert shm.leftovers(str(tmp_path / "absent")) == []
