"""TurboQuant K3V3 (baselines/turboquant.py): codebook, distortion, norm correction, stored bytes, layers, a cell."""
import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from baselines.lloyd_max import gaussian_codebook, gaussian_distortion, standard_normal_lloyd_max
from baselines.turboquant import TurboQuant
from baselines.turboquant_format import pack_tight, unpack_tight
from harness.models import tiny_config
from harness.pipeline import run_cell
from harness.quantizer import KVQuantizer, build_quantizer
from harness.seam import install, kernels_enabled
from kernels.format import QuantSpec, dequantize, quantize
from report.store import ResultsStore

ROOT = Path(__file__).resolve().parent.parent
MAX_1960_8_LEVELS = [0.2451, 0.7560, 1.3440, 2.1520]      # Max (1960), Table I, N = 8 (positive half)
MAX_1960_8_LEVEL_MSE = 0.03454
PROMPT = "The grass is green and the sky is blue. The magic number is 4213. Remember it well, " * 2


def _quantizer(**overrides):
    return build_quantizer("turboquant_k3v3", **overrides)


def _round_trip(quantizer, x):
    """Rotated keys [1, 1, N, D] and their TurboQuant reconstruction."""
    rotated = x @ quantizer.key_rotation(0)
    return rotated, quantizer.dequantize(quantizer.quantize(rotated, quantizer.key_spec))


def _relative_error(x, x_hat):
    """Mean over vectors of |x - x_hat|^2 / |x|^2 (= per-coordinate MSE in units of |x|^2 / D)."""
    return ((x_hat - x).pow(2).sum(-1) / x.pow(2).sum(-1)).mean().item()


# ---------------------------------------------------------------------------------------- codebook
def test_codebook_matches_max_1960():
    centroids = standard_normal_lloyd_max(8)
    expected = [-c for c in reversed(MAX_1960_8_LEVELS)] + MAX_1960_8_LEVELS
    assert centroids == pytest.approx(expected, abs=1e-3)
    assert gaussian_distortion(8) == pytest.approx(MAX_1960_8_LEVEL_MSE, abs=1e-4)
    assert standard_normal_lloyd_max(4)[2:] == pytest.approx([0.4528, 1.5104], abs=1e-3)   # Max's N = 4 row


def test_codebook_for_variance_one_over_d_is_the_standard_one_scaled():
    centroids, boundaries = gaussian_codebook(8, variance=1 / 128)
    standard, _ = gaussian_codebook(8)
    torch.testing.assert_close(centroids * math.sqrt(128), standard)
    torch.testing.assert_close(boundaries, (centroids[1:] + centroids[:-1]) / 2)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_tight_packing_round_trips_in_bits_per_code(bits):
    codes = torch.randint(0, 2 ** bits, (3, 5, 128), dtype=torch.uint8)
    packed = pack_tight(codes, bits)
    assert packed.shape == (3, 5, 128 * bits // 8)
    assert torch.equal(unpack_tight(packed, bits), codes)


# ---------------------------------------------------------------------------------------- distortion
def test_key_error_is_the_lloyd_max_distortion_and_below_uniform_int3():
    """After the rotation each unit-vector coordinate is about N(0, 1/D), so the Lloyd-Max codebook leaves
    ~0.0345 |x|^2 / D per coordinate (slightly less: a unit vector's coordinates have lighter tails than a
    Gaussian). Min-max INT3 over the same rotated vector spends its 8 levels on the range of 128 Gaussians
    (~5.2 sigma): step^2 / 12 ~ 0.046 sigma^2, so the codebook is ~25 % better at equal code bits."""
    x = torch.randn(1, 1, 8192, 128, generator=torch.Generator().manual_seed(0))
    rotated, k_hat = _round_trip(_quantizer(), x)
    uniform = dequantize(quantize(rotated, QuantSpec(bits=3, group=128)))
    error = _relative_error(rotated, k_hat)
    assert error == pytest.approx(gaussian_distortion(8), rel=0.05)
    assert error < 0.8 * _relative_error(rotated, uniform)


def test_keys_beat_naive_int3_on_outlier_channels():
    """Three axis-aligned channels 20x larger: unrotated min-max INT3 spends its range on them (error 2.8),
    the rotation spreads them, and the codebook error stays ~0.0345 |x|^2 / D (0.31 here).

    But min-max INT3 after the same Hadamard does better (0.28): each rotated coordinate is then about one of
    eight +-sums of the three channels, not Gaussian, so the Gaussian codebook is not optimal for it
    (docs/known_limits.md)."""
    k = torch.randn(1, 1, 4096, 128, generator=torch.Generator().manual_seed(1))
    k[..., [3, 50, 97]] *= 20.0
    rotated, k_hat = _round_trip(_quantizer(), k)
    error = (k_hat - rotated).pow(2).mean()
    naive = dequantize(quantize(k, QuantSpec(bits=3, group=128)))
    assert error < 0.2 * (naive - k).pow(2).mean()
    assert error > (dequantize(quantize(rotated, QuantSpec(bits=3, group=128))) - rotated).pow(2).mean()


def test_norm_correction_keeps_the_stored_norm():
    x = torch.randn(1, 2, 512, 128, generator=torch.Generator().manual_seed(2)) * 3.0
    quantizer = _quantizer()
    rotated, k_hat = _round_trip(quantizer, x)
    stored = quantizer.quantize(rotated, quantizer.key_spec).scale.float().squeeze(-1)   # fp16 norms [1, 2, 512]
    torch.testing.assert_close(stored, rotated.norm(dim=-1), rtol=1e-3, atol=0)
    torch.testing.assert_close(k_hat.norm(dim=-1), stored, rtol=1e-5, atol=0)
    _, plain = _round_trip(_quantizer(norm_correction=False), x)
    shrink = (plain.norm(dim=-1) / stored).mean().item()        # centroid condition: E|c|^2 = 1 - distortion
    assert shrink == pytest.approx(math.sqrt(1 - gaussian_distortion(8)), abs=2e-3)


def test_values_are_the_stock_uniform_grid_in_tight_bytes():
    x = torch.randn(2, 3, 16, 128, generator=torch.Generator().manual_seed(3))
    quantizer = _quantizer()
    qt = quantizer.quantize(x, quantizer.value_spec)
    assert qt.codes.shape[-1] == 48 and qt.scale.shape[-1] == qt.zero.shape[-1] == 1
    torch.testing.assert_close(quantizer.dequantize(qt), dequantize(quantize(x, QuantSpec(bits=3, group=128))),
                               rtol=0, atol=0)


# ---------------------------------------------------------------------------------------- accounting
def test_bits_per_element_is_the_vllm_layout():
    """K 3 + 16/128 = 3.125, V 3 + 32/128 = 3.25: 3.1875 (the paper reports 3.25)."""
    assert _quantizer().bits_per_element(131072) == 3.1875
    tiny = _quantizer()
    tiny.check(tiny_config("qwen3", 64))                       # head_dim 64: K 3.25, V 3.5
    assert tiny.bits_per_element(4096) == 3.375


def test_stored_bytes_are_what_bits_per_element_counts(tiny):
    model, tok = tiny("qwen3")
    quantizer = _quantizer()
    quantizer.check(model.config)
    with install(model, quantizer, kernels="reference") as seam, torch.inference_mode():
        cache = seam.new_cache()
        model(**tok([PROMPT], return_tensors="pt"), past_key_values=cache)
    layer = cache.layers[0]
    elements = 2 * layer.history_length * model.config.num_key_value_heads * quantizer.head_dim   # K and V
    assert layer.history_length == layer.get_seq_length() > 0
    assert 8 * (layer.history_k.nbytes() + layer.history_v.nbytes()) / elements == quantizer.bits_per_element(4096)


@pytest.mark.parametrize("skip, quantized", [(0, {0, 1, 2, 3, 4, 5}), (2, {2, 3})])
def test_skip_boundary_layers_leaves_the_first_and_last_layers_in_full_precision(skip, quantized,
                                                                                 full_attention_qwen3):
    model, tok = full_attention_qwen3(6)
    quantizer = _quantizer(skip_boundary_layers=skip)
    quantizer.check(model.config)
    with install(model, quantizer, kernels="reference") as seam, torch.inference_mode():
        cache = seam.new_cache()
        model(**tok([PROMPT], return_tensors="pt"), past_key_values=cache)
    held = {i for i, layer in enumerate(cache.layers) if layer.history_k is not None and layer.history_length}
    assert held == quantized
    skipped = [layer for i, layer in enumerate(cache.layers) if i not in quantized]
    assert all(layer.key_rotation is None for layer in skipped)
    assert quantizer.bits_per_element(4096) == pytest.approx((16.0 * (6 - len(quantized)) + 3.375 * len(quantized)) / 6)


# ---------------------------------------------------------------------------------------- through the harness
def test_decode_reads_the_codebook_history(tiny):
    model, tok = tiny("qwen3")
    enc = tok([PROMPT], return_tensors="pt")

    def greedy(cache=None):
        extra = {} if cache is None else {"past_key_values": cache}
        with torch.inference_mode():
            return model.generate(**enc, max_new_tokens=6, min_new_tokens=6, do_sample=False, output_logits=True,
                                  return_dict_in_generate=True, pad_token_id=tok.pad_token_id, **extra).logits
    stock = greedy()
    quantizer = _quantizer()
    quantizer.check(model.config)
    with install(model, quantizer) as seam:
        ours = greedy(seam.new_cache())
    torch.testing.assert_close(stock[0], ours[0])                   # prefill attends in full precision
    assert (stock[-1] - ours[-1]).abs().max() > 1e-3                # decode reads the quantized history


def test_its_kernels_run_it_and_a_format_without_kernels_keeps_the_reference_path():
    """TurboQuant names kernels for its format (kernel_ops), so kernels=triton / auto on CUDA run them; a quantizer
    with its own quantize/dequantize and no kernels of its own is refused under triton, reference under auto."""
    quantizer = _quantizer()
    assert kernels_enabled(torch.device("cpu"), "triton", quantizer) is True          # TRITON_INTERPRET=1 (conftest)
    assert kernels_enabled(torch.device("cuda"), "auto", quantizer) is True
    assert kernels_enabled(torch.device("cpu"), "auto", quantizer) is False

    class WithoutKernels(TurboQuant):
        kernel_ops = KVQuantizer.kernel_ops
    with pytest.raises(ValueError, match="overrides quantize/dequantize without Triton kernels"):
        kernels_enabled(torch.device("cpu"), "triton", WithoutKernels())
    assert kernels_enabled(torch.device("cuda"), "auto", WithoutKernels()) is False


def test_a_cell_runs_end_to_end(tmp_path):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("config", ["model=tiny_qwen3", "quantizer=turboquant_k3v3", "task=ruler_niah", "ctx=4k",
                                 "task.samples=1", "task.max_new_tokens=4", f"results_dir={tmp_path}"])
    rows = {row["metric"]: row for row in run_cell(cfg, ResultsStore(tmp_path))}
    assert rows["ruler_niah"]["status"] == "ok" and 0.0 <= rows["ruler_niah"]["value"] <= 100.0
    assert rows["ruler_niah"]["run"]["kernels"] is False
    assert rows["bits_per_element"]["value"] == 3.375                # tiny head_dim 64: K 3.25, V 3.5
