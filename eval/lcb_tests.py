"""LiveCodeBench test cases: decoding them, and running one through the sandbox (eval/sandbox.py).

A problem's tests are {"input", "output", "testtype"} objects: `stdin` tests feed `input` to the program
and compare its stdout with `output` line by line (stripped; numbers compared as decimals); `functional`
(LeetCode) tests call `Solution().<func_name>(*args)` with one JSON value per line of `input` and
compare the returned value with the JSON `output` (a tuple counts as a list). As the official runner,
each program gets a header of common imports, and a problem passes when every test does (the first
failure stops it). Private tests come as JSON, or as base64 of zlib of a pickled JSON string: that
pickle is read by an unpickler that refuses every global, so it can only yield plain data.
"""
from __future__ import annotations

import base64
import io
import json
import pickle
import zlib
from decimal import Decimal, InvalidOperation

from eval.sandbox import Limits, run_python

HEADER = ("import sys, os, re, math, string, heapq, bisect, itertools, functools, collections, copy, random, "
          "statistics, operator, json, datetime\n"
          "from typing import *\nfrom collections import *\nfrom itertools import *\nfrom functools import *\n"
          "from heapq import *\nfrom bisect import *\nfrom math import *\nsys.setrecursionlimit(50000)\n\n")
RESULT_MARK = "@@lcb-result@@"
DRIVER = """

import json as _lcb_json, sys as _lcb_sys
_lcb_args = [_lcb_json.loads(_line) for _line in _lcb_sys.stdin.read().split("\\n") if _line.strip()]
_lcb_target = getattr(Solution(), {name!r}) if "Solution" in globals() else globals()[{name!r}]
_lcb_value = _lcb_target(*_lcb_args)
print({mark!r} + _lcb_json.dumps(list(_lcb_value) if isinstance(_lcb_value, tuple) else _lcb_value))
"""


class _DataOnly(pickle.Unpickler):
    """Unpickles plain data only: any class or function reference is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name} in LiveCodeBench test data")


def decode_tests(field: str) -> list[dict]:
    """The test list of a `public_test_cases` / `private_test_cases` field (JSON, or the compressed form)."""
    try:
        return json.loads(field)
    except json.JSONDecodeError:
        blob = zlib.decompress(base64.b64decode(field.encode("utf-8")))
        return json.loads(_DataOnly(io.BytesIO(blob)).load())


def same_stdout(produced: str, expected: str) -> bool:
    """Line-by-line equality of stripped lines; a line that differs may still match as decimal numbers."""
    got, want = produced.strip().split("\n"), expected.strip().split("\n")
    return len(got) == len(want) and all(_same_line(g.strip(), w.strip()) for g, w in zip(got, want))


def _same_line(got: str, want: str) -> bool:
    if got == want:
        return True
    try:
        return [Decimal(x) for x in got.split()] == [Decimal(x) for x in want.split()]
    except InvalidOperation:
        return False


def passes(code: str, test: dict, func_name: str | None, limits: Limits) -> bool:
    """Whether `code` passes one test in the sandbox within `limits`."""
    if test["testtype"] == "functional":
        outcome = run_python(HEADER + code + DRIVER.format(name=func_name, mark=RESULT_MARK), test["input"], limits)
        results = [line[len(RESULT_MARK):] for line in outcome.stdout.splitlines() if line.startswith(RESULT_MARK)]
        return outcome.status == "ok" and bool(results) and _json_or_none(results[-1]) == json.loads(test["output"])
    outcome = run_python(HEADER + code, test["input"], limits)
    return outcome.status == "ok" and same_stdout(outcome.stdout, test["output"])


def _json_or_none(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def passes_all(code: str, tests: list[dict], func_name: str | None, limits: Limits) -> bool:
    """Every test passes (stops at the first failure)."""
    return all(passes(code, test, func_name, limits) for test in tests)
