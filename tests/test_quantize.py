"""Tests for kernels.format: packing layout, codes against a float64 NumPy oracle, error bounds, BPE."""
import numpy as np
import pytest
import torch

from kernels.format import (QuantSpec, bits_per_element, clip_rows, dequantize, pack_codes, quantize,
                            unpack_codes)

NUMPY_DTYPES = {"float16": np.float16, "float32": np.float32}


# ------------------------------------------------------------------------------- NumPy oracle
def oracle_stored(values, scale_dtype):
    """Round float64 metadata to the storage dtype, back to float64."""
    return values.astype(NUMPY_DTYPES[scale_dtype]).astype(np.float64)


def oracle_stored_scale(values, offset, scale_dtype):
    """Stored scale with the two floors: |offset| / (max / 2) before rounding, smallest normal after."""
    info = np.finfo(NUMPY_DTYPES[scale_dtype])
    values = np.maximum(values, np.abs(offset) / (float(info.max) / 2))
    return np.maximum(oracle_stored(values, scale_dtype), float(info.tiny))


def oracle_clip(x, ratio):
    d = x.shape[-1]
    index = min(int(np.floor(ratio * d)), d - 1)
    tau = np.sort(np.abs(x), axis=-1)[..., index:index + 1]
    return np.clip(x, -tau, tau)


def oracle_asymmetric(groups, bits, scale_dtype):
    top = 2 ** bits - 1
    low, high = groups.min(-1, keepdims=True), groups.max(-1, keepdims=True)
    scale = oracle_stored_scale(np.maximum(high - low, 1e-8) / top, low, scale_dtype)
    zero = oracle_stored(-low / scale, scale_dtype)
    return np.clip(np.floor(groups / scale + zero + 0.5), 0, top), scale, zero


def oracle_symmetric(groups, bits, scale_dtype):
    half = 2 ** (bits - 1)
    peak = np.maximum(np.abs(groups).max(-1, keepdims=True), 1e-8)
    scale = oracle_stored_scale(peak / (half - 1), 0.0, scale_dtype)
    signed = np.clip(np.floor(groups / scale + 0.5), -half, half - 1)
    return signed + half, scale, np.full_like(scale, half)


def oracle_lloyd_max(groups, scale_dtype, lm_ratio):
    mu = groups.mean(-1, keepdims=True)
    sigma = np.sqrt(((groups - mu) ** 2).mean(-1, keepdims=True) + 1e-8)
    z = (groups - mu) / sigma
    codes = (z >= -0.98107).astype(np.float64) + (z >= 0) + (z >= 0.98107)
    scale = oracle_stored_scale((2 * 1.50956 / 3) * lm_ratio * sigma, mu, scale_dtype)
    return codes, scale, oracle_stored(1.5 - mu / scale, scale_dtype)


def oracle_quantize(x, bits, group, scale_dtype="float16", symmetric=False, clip_ratio=None,
                    lloyd_max=False, lm_ratio=1.16):
    """float64 quantization with groups of `group` along the LAST axis: (codes, scale, zero)."""
    x = np.asarray(x, dtype=np.float64)
    if clip_ratio is not None:
        x = oracle_clip(x, clip_ratio)
    groups = x.reshape(*x.shape[:-1], x.shape[-1] // group, group)
    if lloyd_max:
        codes, scale, zero = oracle_lloyd_max(groups, scale_dtype, lm_ratio)
    elif symmetric:
        codes, scale, zero = oracle_symmetric(groups, bits, scale_dtype)
    else:
        codes, scale, zero = oracle_asymmetric(groups, bits, scale_dtype)
    return codes.reshape(x.shape).astype(np.uint8), scale[..., 0], zero[..., 0]


def heavy_tailed(shape, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator)
    return x * torch.exp(torch.randn(shape[:-1] + (1,), generator=generator))  # per-row magnitude spread


def assert_matches_oracle(qt, codes, scale, zero, scale_dtype):
    assert torch.equal(unpack_codes(qt.codes, qt.spec.bits), torch.from_numpy(codes))
    ulp = 2 * float(np.finfo(NUMPY_DTYPES[scale_dtype]).eps)  # fp32 vs float64 metadata may differ in the last bit
    np.testing.assert_allclose(qt.scale.double().numpy(), scale, rtol=ulp, atol=0)
    np.testing.assert_allclose(qt.zero.double().numpy(), zero, rtol=ulp, atol=ulp)


# ------------------------------------------------------------------------------- packing
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_pack_unpack_round_trip(bits, head_dim):
    container = {2: 2, 3: 4, 4: 4, 8: 8}[bits]
    generator = torch.Generator().manual_seed(bits * 1000 + head_dim)
    codes = torch.randint(0, 2 ** bits, (3, 5, head_dim), generator=generator, dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 5, head_dim * container // 8)
    assert torch.equal(unpack_codes(packed, bits), codes)


def test_int2_byte_layout_by_hand():
    codes = torch.tensor([1] * 32 + [2] * 32 + [3] * 32 + [0] * 32, dtype=torch.uint8)
    codes[5] = 3    # byte 5: 3 | 2<<2 | 3<<4 | 0<<6
    codes[100] = 2  # byte 4: 1 | 2<<2 | 3<<4 | 2<<6
    expected = torch.full((32,), 1 | 2 << 2 | 3 << 4, dtype=torch.uint8)
    expected[5], expected[4] = 59, 185
    assert torch.equal(pack_codes(codes, 2), expected)


@pytest.mark.parametrize("bits", [3, 4])
def test_nibble_byte_layout_by_hand(bits):
    codes = torch.tensor([1, 2, 3, 4, 5, 6, 7, 0], dtype=torch.uint8)  # byte j = c[j] | c[j+4] << 4
    assert pack_codes(codes, bits).tolist() == [0x51, 0x62, 0x73, 0x04]


def test_int8_packing_is_identity():
    codes = torch.arange(256, dtype=torch.uint8).reshape(2, 128)
    assert torch.equal(pack_codes(codes, 8), codes)


def test_pack_rejects_bad_codes():
    with pytest.raises(ValueError, match="2-bit container"):
        pack_codes(torch.full((8,), 4, dtype=torch.uint8), 2)
    with pytest.raises(ValueError, match="divisible"):
        pack_codes(torch.zeros(6, dtype=torch.uint8), 2)
    with pytest.raises(ValueError, match="bits"):
        unpack_codes(torch.zeros(4, dtype=torch.uint8), 5)


# ------------------------------------------------------------------------------- codes vs oracle
@pytest.mark.parametrize("bits,group,scale_dtype", [(2, 128, "float16"), (2, 32, "float32"),
                                                    (3, 64, "float16"), (4, 128, "float16"), (8, 128, "float32")])
def test_asymmetric_codes_match_oracle(bits, group, scale_dtype):
    x = heavy_tailed((2, 3, 17, 128), seed=bits + group)
    qt = quantize(x, QuantSpec(bits=bits, group=group, scale_dtype=scale_dtype))
    assert qt.scale.dtype == getattr(torch, scale_dtype) and qt.scale.shape == (2, 3, 17, 128 // group)
    assert_matches_oracle(qt, *oracle_quantize(x.numpy(), bits, group, scale_dtype), scale_dtype)


@pytest.mark.parametrize("bits", [2, 4])
def test_symmetric_codes_match_oracle(bits):
    x = heavy_tailed((4, 33, 128), seed=7)
    qt = quantize(x, QuantSpec(bits=bits, symmetric=True))
    assert_matches_oracle(qt, *oracle_quantize(x.numpy(), bits, 128, symmetric=True), "float16")


def test_symmetric_int2_is_ternary():
    qt = quantize(heavy_tailed((64, 128), seed=3), QuantSpec(bits=2, symmetric=True))
    assert set(unpack_codes(qt.codes, 2).unique().tolist()) <= {1, 2, 3}
    assert torch.all(qt.zero == 2)


@pytest.mark.parametrize("ratio,group", [(0.96, 128), (0.92, 64)])
def test_clipped_codes_match_oracle(ratio, group):
    x = heavy_tailed((2, 40, 128), seed=11)
    qt = quantize(x, QuantSpec(bits=2, group=group, clip_ratio=ratio))
    assert_matches_oracle(qt, *oracle_quantize(x.numpy(), 2, group, clip_ratio=ratio), "float16")


def test_clip_rows_threshold_is_whole_row_quantile():
    x = heavy_tailed((5, 128), seed=2)
    clipped = clip_rows(x, 0.96)
    tau = x.abs().sort(dim=-1).values[:, 122:123]
    assert torch.equal(clipped.abs().amax(-1, keepdim=True), tau)
    assert ((clipped != x).sum(-1) == 5).all()  # the 5 largest magnitudes of each row are clamped


@pytest.mark.parametrize("scale_dtype", ["float16", "float32"])
def test_lloyd_max_codes_match_oracle(scale_dtype):
    x = heavy_tailed((3, 50, 128), seed=5)
    qt = quantize(x, QuantSpec(bits=2, lloyd_max=True, clip_ratio=0.96, scale_dtype=scale_dtype))
    oracle = oracle_quantize(x.numpy(), 2, 128, scale_dtype, clip_ratio=0.96, lloyd_max=True)
    assert_matches_oracle(qt, *oracle, scale_dtype)


@pytest.mark.parametrize("bits", [2, 4])
def test_channel_axis_codes_match_oracle(bits):
    x = heavy_tailed((2, 64, 32), seed=13)  # [B, T, D], groups of 32 tokens per channel
    qt = quantize(x, QuantSpec(bits=bits, group=32, axis="channel"))
    assert qt.scale.shape == (2, 2, 32) and qt.codes.shape == (2, 64, 32 * bits // 8)
    codes, scale, zero = oracle_quantize(x.numpy().swapaxes(-1, -2), bits, 32)
    transposed = (codes.swapaxes(-1, -2).copy(), scale.swapaxes(-1, -2), zero.swapaxes(-1, -2))
    assert_matches_oracle(qt, *transposed, "float16")


# ------------------------------------------------------------------------------- dequantization
@pytest.mark.parametrize("bits,scale_dtype", [(2, "float16"), (3, "float32"), (4, "float16"), (8, "float32")])
def test_uniform_dequantize_error_within_half_step(bits, scale_dtype):
    x = heavy_tailed((2, 31, 128), seed=17)
    qt = quantize(x, QuantSpec(bits=bits, group=64, scale_dtype=scale_dtype))
    step = qt.scale.float().repeat_interleave(64, dim=-1)  # [2, 31, 128]
    assert torch.all((dequantize(qt) - x).abs() <= step / 2 + 1e-6)


def test_dequantize_is_code_minus_zero_times_scale():
    x = heavy_tailed((9, 128), seed=19)
    qt = quantize(x, QuantSpec(bits=2, group=64, lloyd_max=False))
    codes = unpack_codes(qt.codes, 2).float().reshape(9, 2, 64)
    expected = (codes - qt.zero.float()[..., None]) * qt.scale.float()[..., None]
    assert torch.equal(dequantize(qt), expected.reshape(9, 128))


@pytest.mark.parametrize("value", [0.0, 3.0, -250.0])
@pytest.mark.parametrize("lloyd_max", [False, True])
def test_constant_rows_stay_finite(value, lloyd_max):
    x = torch.full((4, 128), value)
    x_hat = dequantize(quantize(x, QuantSpec(bits=2, lloyd_max=lloyd_max)))
    assert torch.isfinite(x_hat).all()
    assert torch.allclose(x_hat, x, atol=1e-3 * max(1.0, abs(value)))


# ------------------------------------------------------------------------------- validation and BPE
@pytest.mark.parametrize("options,message", [
    ({"bits": 5}, "bits"),
    ({"group": 0}, "group"),
    ({"axis": "head"}, "axis"),
    ({"scale_dtype": "int8"}, "scale_dtype"),
    ({"clip_ratio": 1.5}, "clip_ratio"),
    ({"axis": "channel", "clip_ratio": 0.9}, "axis='token'"),
    ({"bits": 4, "lloyd_max": True}, "2 bits"),
])
def test_spec_rejects_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        QuantSpec(**options)


def test_quantize_rejects_bad_shapes():
    with pytest.raises(ValueError, match="does not divide head_dim"):
        quantize(torch.randn(4, 96), QuantSpec(group=64))
    with pytest.raises(ValueError, match="tokens"):
        quantize(torch.randn(30, 128), QuantSpec(group=32, axis="channel"))


@pytest.mark.parametrize("spec,expected", [
    (QuantSpec(bits=2, group=128), 2.25),
    (QuantSpec(bits=2, group=128, symmetric=True), 2.25),
    (QuantSpec(bits=4, group=128), 4.25),
    (QuantSpec(bits=3, group=128), 4.25),
    (QuantSpec(bits=2, group=128, scale_dtype="float32"), 2.5),
    (QuantSpec(bits=2, group=32, axis="channel"), 3.0),
])
def test_bits_per_element(spec, expected):
    assert bits_per_element(spec, 128) == expected
