"""MATH-500 task (eval/math500.py) and its answer checker (eval/math_equiv.py): prompts, extraction, scoring."""
from pathlib import Path

import pytest

from eval import math500
from eval.boxed import INSTRUCTION
from eval.math_equiv import is_equivalent, normalize, to_sympy
from harness.task import Record

FIXTURE = str(Path(__file__).parent / "fixtures" / "math500_tiny.jsonl")


def test_builds_local_problems_with_subjects_and_qwen_prompt(tok):
    examples = math500.build_examples(tok, 40000, 0, seed=0, data_path=FIXTURE)
    assert [e.id for e in examples][:2] == ["tiny/algebra/1.json", "tiny/precalculus/2.json"]
    assert examples[0].answers == ["\\frac{1}{2}"] and examples[0].meta["subject"] == "Algebra"
    assert examples[0].prompt == f"Question: What is $\\frac{{3}}{{4}} - \\frac{{1}}{{4}}$?\n{INSTRUCTION}\nAnswer:"
    assert all(e.max_new_tokens == 32768 for e in examples)
    [chat] = math500.build_examples(tok, 40000, 1, seed=0, chat=True, data_path=FIXTURE)
    assert chat.prompt.startswith("<|im_start|>user\nWhat is") and chat.meta["thinking"] is True
    assert chat.prompt.endswith(f"{INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n")


def test_missing_data_is_one_sentence_naming_data_path(tok, tmp_path):
    with pytest.raises(ValueError, match=r"task.data_path=.*is not a file"):
        math500.build_examples(tok, 40000, 1, seed=0, data_path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match=r"set task.data_path=<a local JSONL of \{problem, answer"):
        math500.build_examples(tok, 40000, 1, seed=0, hf_dataset="oscar-test/definitely-missing")


@pytest.mark.parametrize("prediction,reference,equal", [
    ("\\frac{1}{2}", "\\frac{1}{2}", True),
    ("0.5", "\\frac{1}{2}", True),                               # numeric equality through sympy
    ("\\dfrac12", "\\frac{1}{2}", True),
    ("0.333", "\\frac{1}{3}", False),                            # not within 1e-9
    ("\\sqrt{117}", "3\\sqrt{13}", True),
    ("\\frac{\\sqrt{3}}{2}", "\\sin(\\pi/3)", True),
    ("\\sqrt[3]{8}", "2", True),
    ("3+2x", "2x+3", True),                                      # symbolic: agree at fixed points
    ("x^2", "x^3", False),
    ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("(3, \\frac{\\pi}{3})", "\\left( 3, \\frac{\\pi}{2} \\right)", False),
    ("[-2,7]", "(-2,7)", False),                                 # brackets matter for intervals
    ("1, -2", "-2,1", True),                                     # unbracketed lists: any order
    ("1, -2, 3", "-2,1", False),
    ("Evelyn", "\\text{Evelyn}", True),
    ("\\text{(C)}", "C", True),
    ("1,000", "1000", True),
    ("x = 5", "5", True),
    ("90^\\circ", "90", True),
    ("10\\%", "10", True),
    ("\\$17.50", "17.5", True),
    ("1+2i", "2i+1", True),
    ("1011_2", "1011_2", True),
    ("5", "6", False),
    (None, "5", False),                                          # no box
])
def test_equivalence(prediction, reference, equal):
    assert is_equivalent(prediction, reference) is equal


@pytest.mark.parametrize("hostile", ["__import__('os').system('echo hi')", "2^{2^{2^{100}}}", "x" * 400,
                                     "\\frac{1}{2", "\\begin{pmatrix}1\\end{pmatrix}", "(lambda: 1)()"])
def test_untrusted_answers_are_refused_quickly_not_evaluated(hostile):
    assert to_sympy(normalize(hostile)) is None
    assert is_equivalent(hostile, "1") is False


@pytest.mark.parametrize("output,score", [
    ("<think>\\boxed{1}</think>The answer is $\\boxed{\\dfrac{1}{2}}$.", 1.0),
    ("<think>\\boxed{\\frac12}</think>no box here", 0.0),                   # box only inside the thought
    ("</think>first \\boxed{\\frac{1}{2}} then \\boxed{3}", 0.0),            # two boxes: the last counts
    ("</think>first \\boxed{3} then \\boxed{0.5}", 1.0),
    ("</think>\\boxed{\\frac{1}{2}", 0.0),                                   # unclosed box
    ("</think>The answer is 1/2.", 0.0),                                     # no box
])
def test_score_takes_the_last_box_after_thinking(tok, output, score):
    [example] = math500.build_examples(tok, 40000, 1, seed=0, data_path=FIXTURE)     # answer \frac{1}{2}
    assert math500.score(example, output) == score


def test_pass1_and_subject_strata(tok):
    task = math500.Math500(name="math500")
    records = [Record("a", "</think>\\boxed{1}", 1.0, 0, {"thinking": True, "subject": "Algebra"}),
               Record("b", "still thinking", 0.0, 0, {"thinking": True, "subject": "Algebra"}),
               Record("c", "</think>\\boxed{2}", 0.0, 0, {"thinking": True, "subject": "Geometry"}),
               Record("d", "</think>\\boxed{3}", 1.0, 0, {"thinking": True, "subject": "Geometry"})]
    assert task.aggregate(records) == pytest.approx({"math500_pass1": 50.0, "math500_unfinished_thinking": 25.0})
    assert [task.stratum(r) for r in records] == ["Algebra", "Algebra", "Geometry", "Geometry"]
    assert task.intervals(records)["math500_pass1"]["n"] == 4
