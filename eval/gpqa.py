"""GPQA-Diamond (198 graduate-level multiple-choice questions), simple-evals protocol, pass@1.

Data: `datasets.load_dataset("Idavidrein/gpqa", "gpqa_diamond", split="train")` (gated: log in to the
hub first), or `data_path`, a local JSONL with {"Question", "Correct Answer", "Incorrect Answer 1",
"Incorrect Answer 2", "Incorrect Answer 3"} (and "Record ID" when present).
Follows OpenAI simple-evals' GPQA eval (what the OSCAR release ran, METHOD_OSCAR.md §10): the four
choices are shuffled by one `random.Random(shuffle_seed=0)` drawing a permutation per question in data
set order (so every run seed and every quantizer sees the same order, and question i gets simple-evals'
own order), rendered with simple-evals' QUERY_TEMPLATE_MULTICHOICE as one user turn (system message
"You are a helpful assistant." as OSCAR's client sends; thinking on); the answer is the first match of
simple-evals' ANSWER_PATTERN_MULTICHOICE in the text after the last `</think>`, compared with the
correct letter as simple-evals does (no case folding). lm-eval's gpqa tasks use other templates.
"""
from __future__ import annotations

import random
import re

from eval.data import load_rows
from eval.reasoning import ReasoningTask, after_thinking, budgeted_example, pass_metrics, render_turn
from harness.task import Example

TEMPLATE = ("Answer the following multiple choice question. The last line of your response should be of the "
            "following format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by "
            "step before answering.\n\n{Question}\n\nA) {A}\nB) {B}\nC) {C}\nD) {D}")
ANSWER_PATTERN = re.compile(r"(?i)Answer[ \t]*:[ \t]*\$?([A-D])\$?")
CHOICE_FIELDS = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
LETTERS = "ABCD"


def shuffled_question(row: dict, permutation: list[int]) -> tuple[str, str]:
    """(the question in the template with its choices in `permutation` order, the correct letter)."""
    choices = [row[CHOICE_FIELDS[i]] for i in permutation]
    fields = dict(zip(LETTERS, choices), Question=row["Question"])
    return TEMPLATE.format(**fields), LETTERS[permutation.index(0)]


def build_examples(tokenizer, ctx: int, n: int, seed: int, chat: bool = False, data_path: str | None = None,
                   hf_dataset: str = "Idavidrein/gpqa", hf_config: str = "gpqa_diamond", split: str = "train",
                   revision: str | None = None, shuffle_seed: int = 0,
                   system_prompt: str | None = "You are a helpful assistant.", max_new_tokens: int = 32768,
                   enable_thinking: bool = True) -> list[Example]:
    """The first `n` questions (all when n <= 0); `seed` only varies the sampling, never the choice order."""
    rows = load_rows("GPQA-Diamond", data_path, ("Question",) + CHOICE_FIELDS, path=hf_dataset, name=hf_config,
                     split=split, revision=revision)
    rng = random.Random(shuffle_seed)
    permutations = [rng.sample(range(4), 4) for _ in rows]     # drawn for every row: independent of n
    examples = []
    for index, (row, permutation) in enumerate(zip(rows, permutations)):
        if 0 < n <= index:
            break
        question, letter = shuffled_question(row, permutation)
        prompt = render_turn(tokenizer, question, chat, enable_thinking, system=system_prompt)
        examples.append(budgeted_example(tokenizer, str(row.get("Record ID", index)), prompt, [letter], ctx,
                                         max_new_tokens, thinking=bool(chat and enable_thinking),
                                         permutation=permutation))
    return examples


def extract_answer(text: str) -> str | None:
    """The letter of the first 'Answer: X' after the last `</think>` (simple-evals' regex), else None."""
    match = ANSWER_PATTERN.search(after_thinking(text))
    return match.group(1) if match else None


def score(example: Example, output: str) -> float:
    return float(extract_answer(output) == example.answers[0])


def aggregate(records) -> dict[str, float]:
    """`gpqa_diamond_pass1` (x100) and, in thinking mode, the % of outputs that never closed </think>."""
    return pass_metrics("gpqa_diamond", records)


class GpqaDiamond(ReasoningTask):
    """GPQA-Diamond, pass@1: configs/task/gpqa_diamond.yaml's `_target_`."""

    build_examples, score, aggregate = staticmethod(build_examples), staticmethod(score), staticmethod(aggregate)
    HUB_DATASET, FIXTURE = "Idavidrein/gpqa", "tests/fixtures/gpqa_tiny.jsonl"
