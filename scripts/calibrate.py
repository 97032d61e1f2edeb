"""Calibrate OSCAR rotations for a model and write them as RotationZoo files.

    python scripts/calibrate.py model=smollm2_135m                       # essays, 20k tokens per layer
    python scripts/calibrate.py model=gemma3_270m quantizer.value_target=softmax quantizer.compose=u_h
    python scripts/calibrate.py model=smollm2_135m quantizer=ablation/oscar_u     # an ablation's rotations
    python scripts/calibrate.py model=qwen3_8b quantizer.calibration.source=file quantizer.calibration.path=gpqa.txt

The files land in $OSCAR_CACHE/rotations/<hash of model, data, budget, config>/ (k_rotation_qqt_<compose>.pt,
v_rotation_sst_<compose>.pt, key_mean_qqt_<compose>.pt for quantizer.center_keys=true; ktk / vtv in place of
qqt / sst with quantizer.key_target=tensor / quantizer.value_target=tensor), where `python run.py quantizer=oscar`
finds them; pass `quantizer.rotation_dir=<that folder>` to use them elsewhere. Takes the same Hydra overrides as
run.py, with `quantizer=oscar` as the default quantizer (run.py's is bf16); any OSCAR config is taken
(configs/quantizer/ablation/oscar_*.yaml too), other quantizers are refused.
"""
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.cli_args import bad_group_choice  # noqa: E402
from harness.models import load_model  # noqa: E402
from harness.pipeline import build_checked_quantizer, resolve_device  # noqa: E402
from oscar.method import OSCAR  # noqa: E402
from oscar.rotation import load_key_means, load_rotations  # noqa: E402

OSCAR_TARGET = f"{OSCAR.__module__}.{OSCAR.__qualname__}"   # the `_target_` of configs/quantizer/oscar.yaml and ablations


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> None:
    if cfg.quantizer.get("_target_") != OSCAR_TARGET:
        print(f"error: scripts/calibrate.py calibrates OSCAR quantizers only (quantizer=oscar or an "
              f"ablation/oscar_* config), got quantizer={cfg.quantizer.name}.", file=sys.stderr)
        sys.exit(2)
    try:
        quantizer = build_checked_quantizer(cfg.quantizer)     # calibration settings, before the weights load
        loaded = load_model(cfg.model, device=resolve_device(cfg.device))
        quantizer.check(loaded.model.config)
    except ValueError as err:                       # CellError included
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    quantizer.prepare(loaded.model, loaded.tokenizer)
    folder = Path(quantizer.artifact_dir)
    for path in sorted(folder.glob("*_rotation_*.pt")):
        print(f"{path}  ({len(load_rotations(path))} layers)")
    for path in sorted(folder.glob("key_mean_*.pt")):
        print(f"{path}  ({len(load_key_means(path))} layers, read with quantizer.center_keys=true)")


def with_oscar_default(argv: list[str]) -> list[str]:
    """argv with `quantizer=oscar` added when it names no quantizer (run.py's default is bf16)."""
    return argv if any(arg.startswith("quantizer=") for arg in argv) else [*argv, "quantizer=oscar"]


if __name__ == "__main__":
    sys.argv[1:] = with_oscar_default(sys.argv[1:])
    problem = bad_group_choice(sys.argv[1:], Path(__file__).resolve().parents[1] / "configs")
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    main()
