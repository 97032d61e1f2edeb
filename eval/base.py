"""The task interface every eval module implements, and the shared greedy/sampled generation loop.

A generation task is a module in eval/ exposing
    build_examples(tokenizer, ctx, n, seed, **task_cfg) -> list[Example]
    score(example, output) -> float
    aggregate(records) -> dict[str, float]        # metric name -> value for the result rows
Task configs live in configs/task/<name>.yaml; their `module` field names the eval module.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Example:
    """One prompt to generate from, and what a correct answer must contain."""

    id: str
    prompt: str                      # fully templated text given to the tokenizer (chat template already applied)
    answers: list[str]               # reference strings used by the task's scorer
    max_new_tokens: int = 128
    meta: dict = field(default_factory=dict)   # variant, depth, length, ... (kept in the per-example records)


@dataclass
class Record:
    """One scored generation: the audit trail written beside the result rows."""

    example_id: str
    output: str
    score: float
    prompt_tokens: int
    meta: dict = field(default_factory=dict)
