"""Compact (uint8/uint16 source values) and tiled stores read through the Python package as the float32 values of
the float32 row store of the same data, bit for bit (issue 13). The stores are written by the C++ suite's
EncodingFixtures test (tests/reader/encoding_test.cc), which uses the store Writer directly."""
import os
import pathlib
import subprocess

import numpy as np
import pytest

import patchstore


def _reader_tests() -> pathlib.Path:
    cli = os.environ.get("PATCHSTORE_CLI") or patchstore.cli_path()
    exe = pathlib.Path(cli).resolve().parent / "tests" / "reader_tests"
    if not exe.exists():
        pytest.skip(f"the C++ reader_tests binary that writes these stores is not built ({exe})")
    return exe


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("encoded")
    env = dict(os.environ, PATCHSTORE_ENCODED_STORES_DIR=str(d))
    subprocess.run([str(_reader_tests()), "--gtest_filter=EncodingFixtures.*"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return d


@pytest.mark.parametrize("name,ref", [("u8_tiles16.ps", "ref8.ps"), ("u8_rows.ps", "ref8.ps"),
                                      ("f32_tiles8.ps", "ref8.ps"), ("u16_tiles8.ps", "ref16.ps")])
def test_items_and_patches_equal_the_float32_row_store(stores, name, ref):
    with patchstore.Store(stores / ref) as a, patchstore.Store(stores / name) as b:
        assert len(a) == len(b) == 3
        for i in range(len(a)):
            ia, ib = a[i], b[i]
            assert ia.keys() == ib.keys() == {"rgb", "mask"}
            for f in ia:
                assert ib[f].dtype == np.float32 and ib[f].shape == ia[f].shape
                assert ib[f].tobytes() == ia[f].tobytes(), (i, f)  # bit-identical, not just close
                np.testing.assert_array_equal(b.get(i, f), a.get(i, f))
            for (y, x, h, w) in [(0, 0, 8, 8), (3, 5, 16, 16), (7, 9, 17, 23), (36, 44, 1, 1)]:
                pa, pb = a.patch(i, "rgb", y, x, h, w), b.patch(i, "rgb", y, x, h, w)
                assert pb.dtype == np.float32 and pb.shape == (3, h, w)
                assert np.ascontiguousarray(pb).tobytes() == np.ascontiguousarray(pa).tobytes()
        want = "float32" if name.startswith("f32") else name[:name.index("_")].replace("u", "uint")
        assert b.fields["rgb"].dtype == want


def test_float32_row_records_stay_zero_copy(stores):
    with patchstore.Store(stores / "ref8.ps") as a:
        x, y = a.get(0, "rgb"), a.get(0, "rgb")
        assert not x.flags.writeable
        assert np.shares_memory(x, y)  # both views of the map
    with patchstore.Store(stores / "u8_rows.ps") as b:
        x, y = b.get(0, "rgb"), b.get(0, "rgb")
        assert not np.shares_memory(x, y)  # converted copies
        assert x.dtype == np.float32
