"""$OUT, where the benchmark scripts write their JSON (the device tool's result folder): made, or refused in one
sentence, before anything is timed, so that no run loses its rows to a missing folder at its end; and rewritten
after every point (`save`), so that a run stopped early keeps the points it timed."""
from __future__ import annotations

import json
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


def save(out: Path | None, payload: dict) -> None:
    """Write the run's payload (its rows so far) to `out`, where $OUT is set."""
    if out:
        out.write_text(json.dumps(payload, indent=1))
