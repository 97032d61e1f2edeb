"""95% intervals and example counts for a cell's metrics, from its per-example records.

    intervals = metric_intervals(records, task.aggregate, stratum=task.stratum)
    intervals["ruler_niah"]         # {"n": 400, "ci95": [61.2, 70.9]}

A percentile bootstrap: the records are resampled with replacement within each stratum (a RULER variant,
a LongBench dataset: so a summary that averages strata keeps all of them), the task's own `aggregate`
recomputes every metric on each resample, and the 2.5th / 97.5th percentiles bound it. `n` of a metric is
the number of records that contribute to it. Seeded, so a rebuild gives the same numbers.
"""
from __future__ import annotations

import random
from collections import defaultdict

import numpy as np

RESAMPLES = 1000
LEVEL = 95.0


def metric_intervals(records: list, aggregate, stratum=lambda record: "", seed: int = 0,
                     resamples: int = RESAMPLES) -> dict[str, dict]:
    """{metric: {"n": examples behind it, "ci95": [low, high]}} for every metric `aggregate` returns."""
    if not records:
        return {}
    groups: dict[str, list] = defaultdict(list)
    for record in records:
        groups[stratum(record)].append(record)
    rng = random.Random(seed)
    draws: dict[str, list[float]] = defaultdict(list)
    for _ in range(resamples):
        resample = [rng.choice(group) for group in groups.values() for _ in group]
        for metric, value in aggregate(resample).items():
            draws[metric].append(value)
    tail = (100.0 - LEVEL) / 2
    counts = contributing_counts(records, aggregate)
    return {metric: {"n": counts.get(metric, len(records)),
                     "ci95": [float(np.percentile(values, tail)), float(np.percentile(values, 100.0 - tail))]}
            for metric, values in draws.items()}


def contributing_counts(records: list, aggregate) -> dict[str, int]:
    """{metric: how many records produce it on their own} (a variant's metric: that variant's records)."""
    counts: dict[str, int] = defaultdict(int)
    for record in records:
        for metric in aggregate([record]):
            counts[metric] += 1
    return dict(counts)
