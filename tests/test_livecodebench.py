"""LiveCodeBench task (eval/livecodebench.py, eval/lcb_tests.py): window, prompt, tests, sandboxed pass@1."""
import base64
import json
import pickle
import zlib
from pathlib import Path

import pytest

from eval import lcb_tests, livecodebench
from eval.sandbox import Limits
from harness.task import Record

FIXTURE = str(Path(__file__).parent / "fixtures" / "livecodebench_tiny.jsonl")
FENCE = "```"
QUICK = Limits(timeout_s=2.0, memory_mb=1024)
SUM = "a, b = map(int, input().split())\nprint(a + b)\n"
ADD = "class Solution:\n    def addToAll(self, a: int, b: List[int]) -> List[int]:\n        return [a + x for x in b]\n"


@pytest.fixture
def problems(tok):
    stdin, functional = livecodebench.build_examples(tok, 40000, 0, seed=0, data_path=FIXTURE, timeout_s=2.0,
                                                     memory_mb=1024)
    return stdin, functional


def answer(code: str) -> str:
    return f"<think>plan</think>Solution:\n{FENCE}python\n{code}{FENCE}\n"


def test_date_window_keeps_the_problems_in_it(tok):
    assert [e.id for e in livecodebench.build_examples(tok, 40000, 0, 0, data_path=FIXTURE)] == ["tiny_abc_a", "9001"]
    old = livecodebench.build_examples(tok, 40000, 0, 0, data_path=FIXTURE, date_window=["2024-01-01", "2024-12-31"])
    assert [e.id for e in old] == ["tiny_cf_1"]
    assert len(livecodebench.build_examples(tok, 40000, 1, 0, data_path=FIXTURE)) == 1
    with pytest.raises(ValueError, match="no problem in date_window"):
        livecodebench.build_examples(tok, 40000, 0, 0, data_path=FIXTURE, date_window=["2030-01-01", "2030-02-01"])


def test_prompts_are_the_official_ones(tok, problems):
    stdin, functional = problems
    assert stdin.prompt.startswith(livecodebench.SYSTEM + "\n\n### Question:\nRead two integers A and B")
    assert f"### Format: {livecodebench.WITHOUT_STARTER}\n{FENCE}python\n# YOUR CODE HERE\n{FENCE}\n\n" in stdin.prompt
    assert stdin.prompt.endswith("### Answer: (use the provided format with backticks)\n\n")
    assert f"### Format: {livecodebench.WITH_STARTER}\n{FENCE}python\nclass Solution:" in functional.prompt
    assert functional.meta["func_name"] == "addToAll" and functional.meta["tests"] == 3
    [chat] = livecodebench.build_examples(tok, 40000, 1, 0, chat=True, data_path=FIXTURE)
    assert chat.prompt.startswith(f"<|im_start|>system\n{livecodebench.SYSTEM}<|im_end|>\n"
                                  "<|im_start|>user\n### Question:")
    assert chat.meta["thinking"] is True and chat.max_new_tokens == 32768


def test_missing_data_is_one_sentence_naming_data_path(tok):
    with pytest.raises(ValueError, match=r"LiveCodeBench data .*set task.data_path=<a local JSONL of \{question_id"):
        livecodebench.build_examples(tok, 40000, 1, 0, hf_dataset="oscar-test/definitely-missing")


def test_private_tests_decode_from_the_compressed_form_without_running_pickled_code():
    tests = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}]
    packed = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()
    assert lcb_tests.decode_tests(packed) == tests == lcb_tests.decode_tests(json.dumps(tests))
    hostile = base64.b64encode(zlib.compress(pickle.dumps(Path("/etc/passwd")))).decode()      # needs a global
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        lcb_tests.decode_tests(hostile)


@pytest.mark.parametrize("produced,expected,same", [
    ("3\n", "3", True), ("  1 2 \n3\n\n", "1 2\n3", True), ("0.50\n", "0.5", True), ("1e2", "100", True),
    ("3 4", "3  5", False), ("1\n2", "1", False), ("yes", "Yes", False), ("", "0", False),
])
def test_stdout_comparison(produced, expected, same):
    assert lcb_tests.same_stdout(produced, expected) is same


@pytest.mark.parametrize("which,code,passed", [
    (0, SUM, 1.0),
    (0, "a, b = map(int, input().split())\nprint(a - b)\n", 0.0),                  # passes the public test only
    (0, "import sys\nprint(sum(map(int, sys.stdin.read().split())))\nsys.exit(0)\n", 1.0),
    (0, "print(int(input().split()[0]) +\n", 0.0),                                 # does not compile
    (0, "while True:\n    pass\n", 0.0),                                           # times out
    (1, ADD, 1.0),
    (1, ADD.replace("return [a + x for x in b]", "return tuple(a + x for x in b)"), 1.0),   # tuple = list
    (1, ADD.replace("a + x", "a * x"), 0.0),
    (1, "def addToAll(a, b):\n    return [a + x for x in b]\n", 1.0),              # a plain function also serves
    (1, ADD.replace("return", "print('@@lcb-result@@[3, 4]'); import sys; sys.exit(1); return"), 0.0),
])
def test_score_runs_every_test_in_the_sandbox(problems, which, code, passed):
    assert livecodebench.score(problems[which], answer(code)) == passed


@pytest.mark.parametrize("output", ["</think>no code at all",
                                    "<think>" + FENCE + "python\n" + SUM + FENCE + "</think>ok",   # code in the thought
                                    f"</think>{FENCE}python\n{SUM}"])                               # unclosed fence
def test_malformed_answers_fail(problems, output):
    assert livecodebench.score(problems[0], output) == 0.0


def test_hostile_code_fails_safely(problems, tmp_path):
    target = tmp_path / "escaped.txt"
    code = f"open({str(target)!r}, 'w').write('x')\n" + SUM
    assert livecodebench.score(problems[0], answer(code)) == 0.0 and not target.exists()
    assert lcb_tests.passes(SUM, {"input": "2 2\n", "output": "4\n", "testtype": "stdin"}, None, QUICK)


def test_pass1():
    records = [Record("a", "</think>", 1.0, 0, {"thinking": True}), Record("b", "</think>", 0.0, 0, {"thinking": True})]
    assert livecodebench.aggregate(records) == pytest.approx({"livecodebench_pass1": 50.0,
                                                              "livecodebench_unfinished_thinking": 0.0})
