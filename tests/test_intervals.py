"""Bootstrap intervals and example counts of a cell's metrics (harness/intervals.py)."""
from harness.intervals import metric_intervals
from harness.task import Record


def _records(scores, variant="v"):
    return [Record(f"{variant}-{i}", "", float(s), 10, {"variant": variant}) for i, s in enumerate(scores)]


def _mean_x100(records):
    return {"acc": 100.0 * sum(r.score for r in records) / len(records)}


def _by_variant(records):
    groups = {}
    for r in records:
        groups.setdefault(r.meta["variant"], []).append(r.score)
    metrics = {v: 100.0 * sum(s) / len(s) for v, s in groups.items()}
    metrics["overall"] = sum(metrics.values()) / len(metrics)
    return metrics


def test_binary_scores_give_about_the_wilson_interval():
    out = metric_intervals(_records([1] * 60 + [0] * 40), _mean_x100)["acc"]
    low, high = out["ci95"]
    assert out["n"] == 100
    assert abs(low - 50.2) < 3 and abs(high - 69.1) < 3        # Wilson 95% for 60/100: [50.2, 69.1]


def test_more_examples_give_a_narrower_interval():
    narrow = metric_intervals(_records([1, 0] * 200), _mean_x100)["acc"]["ci95"]
    wide = metric_intervals(_records([1, 0] * 10), _mean_x100)["acc"]["ci95"]
    assert narrow[1] - narrow[0] < (wide[1] - wide[0]) / 2


def test_strata_are_resampled_within_and_counted_per_metric():
    records = _records([1] * 30, "a") + _records([0] * 10, "b")
    out = metric_intervals(records, _by_variant, stratum=lambda r: r.meta["variant"])
    assert out["a"] == {"n": 30, "ci95": [100.0, 100.0]} and out["b"] == {"n": 10, "ci95": [0.0, 0.0]}
    assert out["overall"] == {"n": 40, "ci95": [50.0, 50.0]}   # every resample keeps both variants


def test_the_bootstrap_is_seeded():
    records = _records([1, 0, 0, 1, 1, 0, 1] * 5)
    assert metric_intervals(records, _mean_x100) == metric_intervals(records, _mean_x100)
    assert metric_intervals([], _mean_x100) == {}
