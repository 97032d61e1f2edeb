r"""Boxed-answer tasks (AIME25: integers, MATH-500: LaTeX): Qwen3's prompt and the final \boxed{...}.

The prompt is the problem followed by Qwen3's instruction to reason step by step and box the final
answer; the answer is the last complete \boxed{...} after the last `</think>`.
"""
from __future__ import annotations

import re

from eval.reasoning import after_thinking, render_turn

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
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


def boxed_prompt(tokenizer, problem: str, chat: bool, enable_thinking: bool) -> str:
    """One user turn, problem + instruction (chat), or a Question/Answer completion prompt."""
    return render_turn(tokenizer, f"{problem}\n{INSTRUCTION}", chat, enable_thinking,
                       plain=f"Question: {problem}\n{INSTRUCTION}\nAnswer:")
