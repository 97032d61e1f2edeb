"""Command-line checks of run.py and the scripts, before anything is built: one sentence for a bad argument.

    problem = bad_group_choice(["quantizer=oscar,zzz", "ctx=4k"], REPO_ROOT / "configs")
    # "quantizer=zzz names no config in configs/quantizer/; known: ..." (None when every choice has a file)
    parser.add_argument("--batch", type=positive_ints, default=[1, 8])      # argparse types: '1,8' -> [1, 8]
    parser.add_argument("--points", type=batch_ctx_points)                 # '1:32768,8:32768' -> [(1, 32768), ...]

Hydra itself crashes on some group choices (`ctx=0`) and silently drops an unknown choice of an optional group
(`experiment=nope`); run.py, scripts/sweep_plan.py and scripts/calibrate.py ask `bad_group_choice` first. Hydra's
report of an override of a key the config lacks (`task.nope=1`) takes five lines, in a sweep (`-m`) as well; run.py
asks `bad_override` first.
"""
from __future__ import annotations

import argparse
from itertools import islice, product
from pathlib import Path

from kernels.dispatch import HEAD_DIMS

CONFIG_GROUPS = ("model", "quantizer", "task", "ctx", "logger", "debug", "experiment")


def bad_group_choice(argv: list[str], configs: Path) -> str | None:
    """One sentence for the first `group=value` (or a sweep's `group=a,b`) naming no config file of its group."""
    for arg in argv:
        group, sep, value = arg.partition("=")
        if not sep or group not in CONFIG_GROUPS or any(c in value for c in "()[]{}"):
            continue                                       # not a group choice, or a sweep function (glob, range)
        for choice in value.split(","):
            if choice in ("", "null") or (configs / group / f"{choice}.yaml").is_file():
                continue
            known = ", ".join(sorted(p.stem for p in (configs / group).glob("*.yaml")))
            return f"{group}={choice} names no config in configs/{group}/; known: {known}."
    return None


MULTIRUN_FLAGS = ("-m", "--multirun")
MAX_SWEEP_RUNS = 16     # a sweep's group-choice combinations composed by `bad_override`


def bad_override(argv: list[str], configs: Path) -> str | None:
    """One sentence for a `group.key=value` override of a key the composed config lacks, found by composing it as
    run.py's Hydra would (in a `-m` sweep, each of its first MAX_SWEEP_RUNS combinations of group choices: a key may
    exist for one choice only); None when it composes, fails otherwise (Hydra reports that itself), or when argv
    holds another flag (--config-dir moves the configs) or a sweep this cannot list (glob() asks Hydra's loader)."""
    overrides = [arg for arg in argv if arg not in MULTIRUN_FLAGS]
    if any(arg.startswith("-") for arg in overrides):
        return None
    runs = _sweep_runs(overrides) if len(overrides) < len(argv) else [overrides]
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
        for run in runs:
            try:
                compose("config", run)
            except HydraException as err:       # any other report is Hydra's own, when run.py composes
                problem = _missing_key(str(err))
                if problem:
                    return problem
    return None


def _sweep_runs(overrides: list[str]) -> list[list[str]]:
    """Override lists of a `-m` sweep's first MAX_SWEEP_RUNS combinations of group choices, a swept key at its
    first value ([] when Hydra must list them itself)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    options = []
    try:
        for override in OverridesParser.create().parse_overrides(overrides):
            if not override.is_sweep_override():
                options.append([override.input_line])
                continue
            values = list(override.sweep_string_iterator())
            group_choice = "." not in override.key_or_group     # which keys exist depends on group choices alone
            options.append([f"{override.get_key_element()}={value}" for value in values[:None if group_choice else 1]])
    except HydraException:
        return []                   # a syntax error, or glob(): Hydra's own report
    return [list(run) for run in islice(product(*options), MAX_SWEEP_RUNS)]


def _missing_key(report: str) -> str | None:
    """Hydra's five-line report of an override of a missing key as one sentence (None for any other report)."""
    lines = report.splitlines()
    if len(lines) > 1 and lines[0].startswith("Could not override") and "use +" in lines[1]:
        key, addition = lines[0].split("'")[1], lines[1].rpartition("use ")[2]
        return f"{key} is not a key of the composed config (a typo, or an option it lacks); to add it: {addition}."
    return None


def positive_ints(text: str) -> list[int]:
    """argparse type: '1,8' -> [1, 8]; each a positive integer."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers.") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': every value must be at least 1.")
    return values


def positive_int(text: str) -> int:
    """argparse type: one positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not one integer.") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' must be at least 1.")
    return value


def batch_ctx_points(text: str) -> list[tuple[int, int]]:
    """argparse type: '1:32768,8:32768' -> [(1, 32768), (8, 32768)]; batch and ctx positive integers."""
    points = [point.partition(":") for point in text.split(",")]
    if any(not sep for _, sep, _ in points):
        raise argparse.ArgumentTypeError(f"'{text}': each point is batch:ctx, e.g. 8:32768.")
    return [(positive_int(batch), positive_int(ctx)) for batch, _, ctx in points]


def kernel_head_dims(text: str) -> list[int]:
    """argparse type: '64,128' -> [64, 128]; each a head_dim the Triton kernels are built for."""
    values = positive_ints(text)
    if set(values) - set(HEAD_DIMS):
        raise argparse.ArgumentTypeError(f"'{text}': the kernels take head_dim {', '.join(map(str, HEAD_DIMS))}.")
    return values
