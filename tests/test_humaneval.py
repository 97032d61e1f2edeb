"""HumanEval task (eval/humaneval.py): prompt, code extraction, sandboxed pass@1 incl. broken and hostile code."""
from pathlib import Path

import pytest

from eval import humaneval
from harness.task import Record

FIXTURE = str(Path(__file__).parent / "fixtures" / "humaneval_tiny.jsonl")
FENCE = "```"


@pytest.fixture
def problems(tok):
    return humaneval.build_examples(tok, 40000, 0, seed=0, data_path=FIXTURE, timeout_s=2.0, memory_mb=1024)


def answer(code: str, thought: str = "<think>let me see</think>") -> str:
    return f"{thought}Here is the function:\n{FENCE}python\n{code}{FENCE}\n"


def test_prompt_is_the_simple_evals_instruction_and_the_signature(tok, problems):
    assert [e.id for e in problems] == ["Tiny/0", "Tiny/1"]
    assert problems[0].prompt.startswith(humaneval.INSTRUCTION + "from typing import List\n\n\ndef add_all(")
    assert problems[0].meta["entry_point"] == "add_all" and problems[0].max_new_tokens == 32768
    [chat] = humaneval.build_examples(tok, 40000, 1, seed=0, chat=True, data_path=FIXTURE)
    assert chat.prompt.startswith("<|im_start|>user\nRead the following function signature")
    assert chat.prompt.endswith('    """\n<|im_end|>\n<|im_start|>assistant\n') and chat.meta["thinking"]


def test_missing_data_is_one_sentence_naming_data_path(tok):
    with pytest.raises(ValueError, match=r"HumanEval data .*set task.data_path=<a local JSONL of \{task_id"):
        humaneval.build_examples(tok, 40000, 1, seed=0, hf_dataset="oscar-test/definitely-missing")


@pytest.mark.parametrize("output,passed", [
    (answer("def add_all(numbers):\n    return sum(numbers)\n"), 1.0),                    # whole function
    (answer("    return sum(numbers)\n"), 1.0),                                            # body only
    (answer("import math\n\ndef add_all(numbers):\n    return math.fsum(numbers)\n"), 1.0),  # own imports
    ("</think>def add_all(numbers):\n    return sum(numbers)\n", 1.0),                   # no fence: the whole answer
    (answer("def add_all(numbers):\n    return 0\n") + answer("def add_all(numbers):\n    return sum(numbers)\n",
                                                          thought=""), 1.0),           # the last block counts
    (answer("def add_all(numbers):\n    return sum(numbers) + 1\n"), 0.0),                # wrong
    (answer("def add_all(numbers)\n    return sum(numbers)\n"), 0.0),                    # does not compile
    (answer("def add_all(numbers):\n    while True:\n        pass\n"), 0.0),               # times out
    (answer("import sys\nsys.exit(0)\n"), 0.0),                                          # exits before check()
    ("<think>" + answer("def add_all(numbers):\n    return sum(numbers)\n", thought=""), 1.0),   # no </think>
    ("<think>" + answer("def add_all(numbers):\n    return sum(numbers)\n", thought="") + "</think>no code", 0.0),
    ("", 0.0),
])
def test_score_runs_the_tests_in_the_sandbox(problems, output, passed):
    assert humaneval.score(problems[0], output) == passed


def test_prompt_helpers_stay_available_to_a_whole_function(problems):
    helper = answer("def count_vowels(text):\n    return sum(map(_is_vowel, text))\n")     # _is_vowel: the prompt's
    assert humaneval.score(problems[1], helper) == 1.0
    assert humaneval.score(problems[1], answer("def count_vowels(text):\n    return len(text)\n")) == 0.0


def test_hostile_code_fails_safely(problems, tmp_path):
    target = tmp_path / "escaped.txt"
    hostile = answer(f"import os\nos.system('touch {target}')\nopen({str(target)!r}, 'w').write('x')\n"
                     "def add_all(numbers):\n    return sum(numbers)\n")
    assert humaneval.score(problems[0], hostile) == 0.0 and not target.exists()


def test_pass1(problems):
    records = [Record("a", "</think>", 1.0, 0, {"thinking": True}), Record("b", "", 0.0, 0, {"thinking": True})]
    assert humaneval.aggregate(records) == pytest.approx({"humaneval_pass1": 50.0,
                                                          "humaneval_unfinished_thinking": 50.0})
