"""GPQA-Diamond task (eval/gpqa.py): simple-evals template, fixed choice shuffle, answer extraction, scoring."""
from pathlib import Path

import pytest

from eval import gpqa
from harness.task import Record

FIXTURE = str(Path(__file__).parent / "fixtures" / "gpqa_tiny.jsonl")
FIRST_QUESTION = (
    "Answer the following multiple choice question. The last line of your response should be of the following "
    "format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by step before answering."
    "\n\nWhich particle carries the electromagnetic force?\n\n"
    "A) The graviton\nB) The gluon\nC) The photon\nD) The W boson")     # random.Random(0): [3, 1, 0, 2]


def test_prompt_is_the_simple_evals_template_with_simple_evals_shuffle(tok):
    examples = gpqa.build_examples(tok, 40000, 0, seed=0, data_path=FIXTURE, system_prompt=None)
    assert [e.id for e in examples] == ["tiny-q1", "tiny-q2", "tiny-q3"]
    assert examples[0].prompt == FIRST_QUESTION
    assert [e.answers for e in examples] == [["C"], ["D"], ["C"]]
    assert all(e.max_new_tokens == 32768 for e in examples)


def test_choice_order_ignores_the_run_seed_and_the_sample_count(tok):
    every = gpqa.build_examples(tok, 40000, 0, seed=0, data_path=FIXTURE)
    assert [e.prompt for e in gpqa.build_examples(tok, 40000, 0, seed=7, data_path=FIXTURE)] == \
        [e.prompt for e in every]
    assert gpqa.build_examples(tok, 40000, 2, seed=3, data_path=FIXTURE)[1].prompt == every[1].prompt
    other = gpqa.build_examples(tok, 40000, 0, seed=0, data_path=FIXTURE, shuffle_seed=1)
    assert [e.meta["permutation"] for e in other] != [e.meta["permutation"] for e in every]
    for example in every + other:        # the correct letter always points at the correct answer
        assert f"{example.answers[0]}) " + {"tiny-q1": "The photon", "tiny-q2": "-2",
                                             "tiny-q3": "The mitochondrion"}[example.id] in example.prompt


def test_chat_prompt_has_the_system_message_and_thinking(tok):
    [first, *_] = gpqa.build_examples(tok, 40000, 1, seed=0, chat=True, data_path=FIXTURE)
    assert first.prompt.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                                   "Answer the following multiple choice question.")
    assert first.prompt.endswith("D) The W boson<|im_end|>\n<|im_start|>assistant\n") and first.meta["thinking"]


def test_missing_data_is_one_sentence_naming_data_path(tok):
    with pytest.raises(ValueError, match=r"GPQA-Diamond data .*set task.data_path=<a local JSONL of \{Question"):
        gpqa.build_examples(tok, 40000, 1, seed=0, hf_dataset="oscar-test/definitely-missing")


@pytest.mark.parametrize("text,letter", [
    ("<think>Answer: A? no.</think>Reasoning...\nAnswer: C", "C"),
    ("</think>Answer:$B$", "B"),
    ("</think>answer :\tD", "D"),
    ("</think>Answer: C\nAnswer: D", "C"),                      # simple-evals takes the first match
    ("</think>answer: c", "c"),                                 # matched case-insensitively, not folded
    ("</think>Answer: E", None),                                # not a choice
    ("</think>The answer is C.", None),                         # no 'Answer:' line
    ("<think>Answer: C but I keep thinking", "C"),              # no </think>: the whole text
    ("", None),
])
def test_extract_answer(text, letter):
    assert gpqa.extract_answer(text) == letter


def test_score_and_pass1(tok):
    [first, *_] = gpqa.build_examples(tok, 40000, 1, seed=0, data_path=FIXTURE)       # correct: C
    assert gpqa.score(first, "</think>Answer: C") == 1.0
    assert gpqa.score(first, "</think>Answer: A") == 0.0
    assert gpqa.score(first, "</think>answer: c") == 0.0
    assert gpqa.score(first, "</think>Answer: E") == 0.0
    assert gpqa.score(first, "<think>Answer: C</think>I am not sure.") == 0.0
    records = [Record("a", "</think>Answer: C", 1.0, 0, {"thinking": True}),
               Record("b", "Answer: C", 0.0, 0, {"thinking": True})]
    assert gpqa.aggregate(records) == pytest.approx({"gpqa_diamond_pass1": 50.0,
                                                     "gpqa_diamond_unfinished_thinking": 50.0})
