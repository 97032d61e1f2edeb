"""$OUT, where the benchmark scripts write their JSON (the device tool's result folder): made, or refused in one
sentence, before anything is timed, so that no run loses its rows to a missing folder at its end."""
from __future__ import annotations

import os
from pathlib import Path


def out_file(name: str) -> Path | None:
    """$OUT/name with its folder made now; None without $OUT. Exits in one sentence if the folder cannot be made."""
    folder = os.environ.get("OUT")
    if not folder:
        return None
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SystemExit(f"OUT={folder}: cannot make that folder for the results ({exc.strerror}).") from None
    return Path(folder, name)
