"""idx reader: made files in every accepted layout, bad files, and the real Fashion-MNIST."""

import gzip
import struct

import numpy as np
import pytest

from ds_bench.data.idx import find_split, load_split, read_idx
from ds_bench.errors import UserError


def write_idx(path, array: np.ndarray, gz: bool = False):
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    (gzip.open if gz else open)(str(path) + (".gz" if gz else ""), "wb").write(data)


@pytest.mark.parametrize("sub,gz", [("", False), ("", True), ("MNIST/raw", True), ("FashionMNIST/raw", False)])
def test_layouts(tmp_path, sub, gz):
    images = np.arange(3 * 28 * 28).reshape(3, 28, 28) % 256
    write_idx(tmp_path / sub / "train-images-idx3-ubyte", images, gz)
    write_idx(tmp_path / sub / "train-labels-idx1-ubyte", np.array([7, 1, 4]), gz)
    x, y = load_split(str(tmp_path))
    assert x.shape == (3, 28, 28) and y.tolist() == [7, 1, 4]
    assert np.array_equal(x.numpy(), images.astype(np.uint8))


def test_bad_magic_and_truncation(tmp_path):
    (tmp_path / "f").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(UserError, match="bad magic number"):
        read_idx(str(tmp_path / "f"))
    (tmp_path / "g").write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 10) + b"\x00" * 3)
    with pytest.raises(UserError, match=r"header says \(10,\) but holds 3 values"):
        read_idx(str(tmp_path / "g"))


def test_truncated_header(tmp_path):
    (tmp_path / "h").write_bytes(bytes([0, 0, 8, 3]) + b"\x00\x00")
    with pytest.raises(UserError, match="idx header truncated"):
        read_idx(str(tmp_path / "h"))


def test_missing_files_name_where_it_looked(tmp_path):
    with pytest.raises(UserError, match="no train-images-idx3-ubyte.*MNIST/raw"):
        find_split(str(tmp_path))


def test_real_fashion_mnist(fashion_mnist):
    x, y = load_split(str(fashion_mnist), "train")
    assert x.shape == (60000, 28, 28) and y.shape == (60000,)
    assert sorted(set(y.tolist())) == list(range(10))
    x, y = load_split(str(fashion_mnist), "t10k")
    assert len(x) == 10000
