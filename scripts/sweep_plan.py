"""Print a sweep's plan (cells, estimated GPU-hours, memory per cell) without running it (report/sweep_plan.py).

    python scripts/sweep_plan.py experiment=paper_main
    python scripts/sweep_plan.py experiment=paper_ruler model=qwen3_8b quantizer=bf16,oscar

Takes run.py's overrides; `python run.py -m ...` prints the same plan before its first cell.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: E402
from hydra.errors import HydraException  # noqa: E402
from omegaconf import open_dict  # noqa: E402
from omegaconf.errors import OmegaConfBaseException  # noqa: E402

from harness.cli_args import bad_group_choice  # noqa: E402
from report.sweep_plan import sweep_plan  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def plan(overrides: list[str]) -> str:
    """The plan of `python run.py -m <overrides>`: composed without the sweep values, expanded with them."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    fixed = [text for text, item in zip(overrides, parsed) if not item.is_sweep_override()]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        config = compose(config_name="config", overrides=fixed, return_hydra_config=True)
        with open_dict(config):
            config.hydra.overrides.task = list(overrides)
        return sweep_plan(config)


def main(argv: list[str]) -> int:
    """Print the plan; a bad override is one line on stderr and exit status 2."""
    problem = bad_group_choice(argv, CONFIGS)
    if problem is None:
        try:
            print(plan(argv))
            return 0
        except (HydraException, OmegaConfBaseException) as err:
            problem = " ".join(line.strip() for line in str(err).strip().splitlines()[:2])
    print(f"error: {problem}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
