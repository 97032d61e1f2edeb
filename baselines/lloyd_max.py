"""The MSE-optimal (Lloyd-Max) scalar quantizer of a Gaussian, solved here rather than tabulated.

    from baselines.lloyd_max import gaussian_codebook
    centroids, boundaries = gaussian_codebook(levels=8)          # N(0, 1): [8], [7], float64
    centroids, boundaries = gaussian_codebook(8, variance=1/128)  # N(0, 1/d), TurboQuant's key codebook

Method: Lloyd's iteration on the N(0, 1) density with exact cell statistics. Each step puts the decision
boundaries at the midpoints of adjacent centroids (nearest-neighbour condition) and moves every centroid to
the conditional mean of its cell (centroid condition), which for a standard normal has the closed form

    E[X | a < X <= b] = (pdf(a) - pdf(b)) / (cdf(b) - cdf(a)),

so no numerical integration is involved. Starting from levels spread uniformly over +-2 sigma, the
iteration stops once no centroid moves by more than `tol`. The codebook for variance s^2 is the
standard one scaled by s. vLLM's TurboQuant (centroids.py) solves the same fixed point with a
200-point trapezoid rule per cell instead of the closed form.
"""
from __future__ import annotations

import math

import torch

TOLERANCE = 1e-13
MAX_ITERATIONS = 10_000


def _pdf(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) if math.isfinite(x) else 0.0


def _cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _midpoints(centroids: list[float]) -> list[float]:
    return [(lo + hi) / 2 for lo, hi in zip(centroids[:-1], centroids[1:])]


def _cell_means(edges: list[float]) -> list[float]:
    """Conditional mean of N(0, 1) on each cell (edges[i], edges[i + 1]]."""
    return [(_pdf(a) - _pdf(b)) / (_cdf(b) - _cdf(a)) for a, b in zip(edges[:-1], edges[1:])]


def standard_normal_lloyd_max(levels: int, tol: float = TOLERANCE) -> list[float]:
    """Sorted centroids of the `levels`-level Lloyd-Max quantizer of N(0, 1)."""
    if levels < 2:
        raise ValueError(f"a Lloyd-Max codebook needs at least 2 levels, got {levels}.")
    centroids = [-2.0 + 4.0 * (i + 0.5) / levels for i in range(levels)]
    for _ in range(MAX_ITERATIONS):
        updated = _cell_means([-math.inf, *_midpoints(centroids), math.inf])
        moved = max(abs(new - old) for new, old in zip(updated, centroids))
        centroids = updated
        if moved < tol:
            return centroids
    raise RuntimeError(f"Lloyd iteration for {levels} levels did not converge in {MAX_ITERATIONS} steps.")


def gaussian_codebook(levels: int, variance: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(centroids [levels], decision boundaries [levels - 1]) of N(0, variance), float64, sorted."""
    scale = math.sqrt(variance)
    centroids = standard_normal_lloyd_max(levels)
    return (torch.tensor(centroids, dtype=torch.float64) * scale,
            torch.tensor(_midpoints(centroids), dtype=torch.float64) * scale)


def gaussian_distortion(levels: int) -> float:
    """Mean squared error per coordinate of the Lloyd-Max quantizer of N(0, 1).

    At the fixed point each centroid is its cell's mean, so E[(X - Q(X))^2] = E[X^2] - E[Q(X)^2]
    = 1 - sum_i P(cell i) * c_i^2.
    """
    centroids = standard_normal_lloyd_max(levels)
    edges = [-math.inf, *_midpoints(centroids), math.inf]
    mass = [_cdf(b) - _cdf(a) for a, b in zip(edges[:-1], edges[1:])]
    return 1.0 - sum(p * c * c for p, c in zip(mass, centroids))
