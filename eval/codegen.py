"""What the code-generation tasks (HumanEval, LiveCodeBench) share: the program in a model's answer.

    code = code_block(output)      # the last ```python fenced block after </think>, or None
"""
from __future__ import annotations

import re

from eval.reasoning import after_thinking

_FENCE = re.compile(r"```[ \t]*(?:python3?|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


def code_block(text: str) -> str | None:
    """The last complete fenced block tagged python (or untagged) after the last `</think>`; None if none."""
    blocks = _FENCE.findall(after_thinking(text))
    return blocks[-1] if blocks else None
