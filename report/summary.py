"""The short summary table printed at the end of a run."""
from __future__ import annotations


def print_summary(rows: list[dict]) -> None:
    if not rows:
        return
    head = rows[0]
    print(f"\n{head['model']} | {head['quantizer']} | {head['task']} | {head['ctx']} | seed {head['seed']}"
          f" | {head.get('device', '')} | {head.get('wall_time_s', '?')} s | status {head.get('status')}")
    width = max(len(r["metric"]) for r in rows)
    for row in rows:
        value = row["value"]
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"  {row['metric']:<{width}}  {shown}")
    if head.get("status") == "error":
        print(f"  error: {head.get('error')}")
