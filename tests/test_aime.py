"""AIME25 task (eval/aime25.py): local data, prompts, answer extraction, scoring and pass@1."""
from pathlib import Path

import pytest

from eval import aime25
from harness.task import Record

FIXTURE = str(Path(__file__).parent / "fixtures" / "aime_tiny.jsonl")


def test_builds_local_problems_in_order_with_integer_answers(tok):
    examples = aime25.build_examples(tok, 40000, 0, seed=0, data_path=FIXTURE)
    assert [e.id for e in examples] == ["tiny-1", "tiny-2", "tiny-3", "tiny-4"]
    assert [e.answers for e in examples] == [["55"], ["9"], ["24"], ["49"]]      # "049" normalised
    assert examples[0].prompt == ("Question: What is the sum of the first ten positive integers?\n"
                                  f"{aime25.INSTRUCTION}\nAnswer:")
    assert all(e.max_new_tokens == 32768 for e in examples)
    assert len(aime25.build_examples(tok, 40000, 2, seed=5, data_path=FIXTURE)) == 2


def test_chat_prompt_is_one_user_turn_with_thinking_on_by_default(tok):
    [first, *_] = aime25.build_examples(tok, 40000, 1, seed=0, chat=True, data_path=FIXTURE)
    assert first.prompt.startswith("<|im_start|>user\nWhat is the sum")
    assert first.prompt.endswith(f"{aime25.INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n")
    assert first.meta["thinking"] is True
    [plain] = aime25.build_examples(tok, 40000, 1, seed=0, chat=True, data_path=FIXTURE, enable_thinking=False)
    assert plain.prompt.endswith("<think>\n\n</think>\n\n") and plain.meta["thinking"] is False


def test_generation_budget_is_cut_to_ctx_and_tiny_ctx_raises(tok):
    [example] = aime25.build_examples(tok, 1000, 1, seed=0, chat=True, data_path=FIXTURE)
    assert example.max_new_tokens + len(tok(example.prompt)["input_ids"]) == 1000
    with pytest.raises(ValueError, match="too small"):
        aime25.build_examples(tok, 50, 1, seed=0, data_path=FIXTURE)


def test_missing_data_raises_one_clear_error(tok, tmp_path):
    with pytest.raises(ValueError, match="data_path"):
        aime25.build_examples(tok, 40000, 1, seed=0, data_path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="set task.data_path="):      # the hub is offline in tests
        aime25.build_examples(tok, 40000, 1, seed=0, hf_dataset="oscar-test/definitely-missing")


@pytest.mark.parametrize("text,expected", [
    (r"<think>try \boxed{12}</think>The answer is \boxed{\frac{1}{2}} no, \boxed{033}", 33),
    (r"<think>long thought \boxed{5}</think>", None),                          # box only inside the thought
    (r"no closing tag, so the whole text counts: \boxed{7}", 7),
    (r"</think>first \boxed{1} then \boxed{2}", 2),                            # several boxes: the last
    (r"</think>\boxed{1,000}", 1000),
    (r"</think>\boxed{\text{ 42 }}.", 42),
    (r"</think>$\boxed{{5}}$", 5),                                              # nested braces
    (r"</think>\boxed{\dfrac{3}{4}}", None),                                    # not an integer
    (r"</think>\boxed{7} and then \boxed{8", 7),                                # unclosed box ignored
    (r"</think>The answer is 12.", None),                                       # no box
    (r"a</think>b</think>\boxed{9}", 9),                                        # after the last </think>
])
def test_extract_answer(text, expected):
    assert aime25.extract_answer(text) == expected


def test_score_and_pass1(tok):
    [example] = aime25.build_examples(tok, 40000, 1, seed=0, data_path=FIXTURE)     # answer 55
    assert aime25.score(example, r"</think>so \boxed{55}") == 1.0
    assert aime25.score(example, r"</think>so \boxed{055}") == 1.0
    assert aime25.score(example, r"</think>so \boxed{56}") == 0.0
    assert aime25.score(example, "55") == 0.0                                  # unboxed answers do not count
    records = [Record("a", r"</think>\boxed{55}", 1.0, 0, {"thinking": True}),
               Record("b", r"still thinking \boxed{3}", 0.0, 0, {"thinking": True}),
               Record("c", r"</think>\boxed{1}", 0.0, 0, {"thinking": True}),
               Record("d", r"</think>\boxed{2}", 1.0, 0, {"thinking": True})]
    assert aime25.aggregate(records) == pytest.approx({"aime25_pass1": 50.0, "aime25_unfinished_thinking": 25.0})
    assert aime25.aggregate([Record("e", "x", 1.0, 0, {"thinking": False})]) == {"aime25_pass1": 100.0}
