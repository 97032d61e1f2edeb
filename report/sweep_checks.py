"""Hydra callbacks of a sweep (configs/config.yaml, `hydra.callbacks`): refuse a launcher that cannot run here.

`hydra/launcher=slurm` off a cluster would otherwise end in submitit's traceback after the sweep was composed;
this says so in one sentence before any job starts. (Hydra turns an exception raised by a callback into a
warning, so the refusal exits itself.)
"""
from __future__ import annotations

import shutil
import sys

from hydra.experimental.callback import Callback


class LauncherCheck(Callback):
    """Before a multirun starts: the SLURM launcher needs `sbatch` and `srun` on this machine."""

    def on_multirun_start(self, config, **kwargs) -> None:
        target = str(config.hydra.launcher.get("_target_", ""))
        if target.endswith("SlurmLauncher") and not (shutil.which("sbatch") and shutil.which("srun")):
            print("error: hydra/launcher=slurm needs a SLURM cluster (sbatch and srun are not on this machine's "
                  "PATH); run the sweep on the cluster's login node, or here with hydra/launcher=local.",
                  file=sys.stderr)
            sys.exit(2)
