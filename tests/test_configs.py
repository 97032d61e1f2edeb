"""Every config in every group composes, alone and in combination with the other axes."""
import itertools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


@pytest.fixture(scope="module")
def composer():
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        yield lambda overrides: compose(config_name="config", overrides=overrides)


AXES = ("model", "quantizer", "task")     # the three groups whose choices interact


def _pairs_of_axes():
    """Every pair of values of two of the three axes that interact (model, quantizer, task), the third at its first
    value: each pair composes together (the full product's 1,089 compositions took 146 s; no config of the three
    groups interpolates another group's values)."""
    axes = {axis: options(axis) for axis in AXES}
    for first, second in itertools.combinations(axes, 2):
        third = next(axis for axis in axes if axis not in (first, second))
        for a, b in itertools.product(axes[first], axes[second]):
            yield {first: a, second: b, third: axes[third][0]}


def test_every_pair_of_model_quantizer_and_task_composes(composer):
    for axis in AXES:                                   # the premise of pairs: no axis reads another's values
        for path in (CONFIGS / axis).glob("*.yaml"):
            assert not any(f"${{{other}." in path.read_text() for other in AXES if other != axis), path
    for choice in _pairs_of_axes():
        cfg = composer([f"{axis}={name}" for axis, name in choice.items()])
        model, quantizer, task = choice["model"], choice["quantizer"], choice["task"]
        assert cfg.model.name == (None if model == "local" else model)     # local: its folder's name, at validation
        assert cfg.quantizer.name == quantizer and cfg.task.name == task
        assert cfg.task._target_.startswith("eval.")


@pytest.mark.parametrize("group", ["logger", "experiment", "debug"])
def test_optional_groups_compose(composer, group):
    for name in options(group):
        cfg = composer([f"{group}={name}"])
        assert cfg.model.name


def test_debug_tiny_shrinks_the_run(composer):
    cfg = composer(["debug=tiny"])
    assert cfg.model.source == "tiny" and cfg.task.samples <= 4


def test_ctx_group_has_token_counts(composer):
    expected = {"4k": 4096, "8k": 8192, "16k": 16384, "32k": 32768, "64k": 65536, "128k": 131072}
    assert {c: composer([f"ctx={c}"]).ctx.tokens for c in expected} == expected


def test_debug_and_experiment_override_the_primary_config(composer):
    """debug=tiny writes into its own store, never the committed results/ (config.yaml's values come first)."""
    assert composer(["debug=tiny"]).results_dir == "outputs/debug_results"
    assert composer([]).results_dir == "results"
    assert composer(["debug=tiny", "results_dir=/tmp/x"]).results_dir == "/tmp/x"
