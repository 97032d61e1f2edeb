r"""The final answer of a boxed-answer task: the last complete \boxed{...} after the last `</think>`.

Shared by AIME25 (integer answers) and MATH-500 (LaTeX answers).
"""
from __future__ import annotations

import re

from eval.reasoning import after_thinking

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\{")


def box_contents(text: str) -> list[str]:
    r"""Contents of every complete \boxed{...} / \fbox{...}, in order, with nested braces matched."""
    found = []
    for match in _BOX_OPEN.finditer(text):
        depth, start = 1, match.end()
        for pos in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[pos], 0)
            if depth == 0:
                found.append(text[start:pos])
                break
    return found


def last_boxed(text: str) -> str | None:
    r"""The last complete \boxed{} after the last `</think>` (the whole text without one); None if none."""
    boxes = box_contents(after_thinking(text))
    return boxes[-1] if boxes else None
