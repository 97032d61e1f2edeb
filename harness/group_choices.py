"""Command-line group choices checked against the config files, before Hydra composes anything.

    problem = bad_group_choice(["quantizer=oscar,zzz", "ctx=4k"], REPO_ROOT / "configs")
    # "quantizer=zzz names no config in configs/quantizer/; known: ..." (None when every choice has a file)

Hydra itself crashes on some of these (`ctx=0`) and silently drops an unknown choice of an optional group
(`experiment=nope`); run.py and scripts/sweep_plan.py ask this first.
"""
from __future__ import annotations

from pathlib import Path

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
