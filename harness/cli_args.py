"""Command-line checks of run.py and the scripts, before anything is built: one sentence for a bad argument.

    problem = bad_group_choice(["quantizer=oscar,zzz", "ctx=4k"], REPO_ROOT / "configs")
    # "quantizer=zzz names no config in configs/quantizer/; known: ..." (None when every choice has a file)
    parser.add_argument("--batch", type=positive_ints, default=[1, 8])      # argparse types: '1,8' -> [1, 8]
    parser.add_argument("--points", type=batch_ctx_points)                 # '1:32768,8:32768' -> [(1, 32768), ...]

Hydra itself crashes on some group choices (`ctx=0`) and silently drops an unknown choice of an optional group
(`experiment=nope`); run.py, scripts/sweep_plan.py and scripts/calibrate.py ask `bad_group_choice` first. Hydra's
report of an override of a key the config lacks (`task.nope=1`) takes five lines; run.py asks `bad_override` first.
"""
from __future__ import annotations

import argparse
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


def bad_override(argv: list[str], configs: Path) -> str | None:
    """One sentence for a `group.key=value` override of a key the composed config lacks, found by composing it as
    run.py's Hydra would; None when it composes, fails otherwise (Hydra reports that itself), or when argv holds a
    flag (-m sweeps list values, --config-dir moves the configs)."""
    if any(arg.startswith("-") for arg in argv):
        return None
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException
    try:
        with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
            compose("config", list(argv))
    except ConfigCompositionException as err:
        lines = str(err).splitlines()
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
