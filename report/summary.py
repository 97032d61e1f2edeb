"""The short summary of a cell's rows logged at the end of a run."""
from __future__ import annotations


def summary_text(rows: list[dict]) -> str:
    """A heading (model | quantizer | task | ctx | seed | device | time | status), then one line per metric."""
    if not rows:
        return ""
    head = rows[0]
    lines = [f"{head['model']} | {head['quantizer']} | {head['task']} | {head['ctx']} | seed {head['seed']}"
             f" | {head.get('device', '')} | {head.get('wall_time_s', '?')} s | status {head.get('status')}"]
    width = max(len(r["metric"]) for r in rows)
    for row in rows:
        value = row["value"]
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        lines.append(f"  {row['metric']:<{width}}  {shown}")
    if head.get("status") == "error":
        lines.append(f"  error: {head.get('error')}")
    return "\n".join(lines)
