"""E4M3 stores against the ml_dtypes oracle: every FP16 input at several scales, stored
through the library's CPU backend (qsakv_store_kv), equals ml_dtypes.float8_e4m3fn of the
FP32 quotient clamped to +-448, bit for bit."""
import ctypes
import os

import ml_dtypes
import numpy as np
import pytest

from qsakv_ctypes_min import Lib

SCALES = [1.0, 0.5, 1.0 / 448.0, 0.0123, 3.7, 1e-3, 100.0]


def oracle(x_fp16: np.ndarray, scale: float) -> np.ndarray:
    q = x_fp16.astype(np.float32) / np.float32(scale)  # FP32 division: the contract
    q = np.where(np.isnan(q), q, np.clip(q, -448.0, 448.0)).astype(np.float32)
    return q.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


@pytest.mark.parametrize("scale", SCALES)
def test_every_fp16_input_matches_ml_dtypes(scale):
    lib = Lib()
    all_fp16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    got = lib.store_e4m3(all_fp16, scale)
    want = oracle(all_fp16, scale)
    nan = np.isnan(all_fp16)
    # NaN stays NaN (the sign may differ between implementations).
    assert np.all((got[nan] & 0x7F) == 0x7F)
    mism = np.nonzero(got[~nan] != want[~nan])[0]
    assert mism.size == 0, f"{mism.size} mismatches, first input {all_fp16[~nan][mism[0]]}"


def test_decode_all_codes_matches_ml_dtypes():
    lib = Lib()
    codes = np.arange(256, dtype=np.uint8)
    want = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    # Round trip through the library: store exact E4M3 values at scale 1, read back.
    finite = ~np.isnan(want)
    vals = want[finite].astype(np.float16)  # every E4M3 value is exact in FP16
    got = lib.store_e4m3(vals, 1.0)
    assert np.array_equal(got, codes[finite]) or np.array_equal(
        got.view(ml_dtypes.float8_e4m3fn).astype(np.float32), want[finite])
