r"""Is a MATH answer equivalent to the reference? Normalised strings, then tuples, then numbers (sympy).

Our own checker: `math_verify` (what BASELINES_AND_TASKS.md §3.2 suggests) is not installed in this
environment, and sympy's LaTeX parser needs antlr4 / lark, which are not either. So:

1. both answers are normalised (MATH/Hendrycks-style: `\left`/`\right`, `\text{}` wrappers, `\dfrac`,
   `\$`, `%`, degrees, spaces, a leading `x=`, thousands separators, `\frac12`, `.5`) and compared as strings;
2. tuples / intervals compare element by element with the same brackets; unbracketed lists ("all
   solutions") compare as multisets;
3. otherwise a small LaTeX subset (numbers, letters, + - * / ^, `\frac`, `\sqrt[n]{}`, `\pi`, `\infty`,
   `\cdot`, `\times`, log / trig) is translated to a sympy expression (parsed unevaluated, names
   whitelisted, exponents bounded, so model output can neither run code nor blow up), and two
   expressions are equal when they agree numerically (relative 1e-9) at three fixed points of their
   free symbols. `0.5` equals `\frac{1}{2}`; `0.333` does not equal `\frac{1}{3}`.
"""
from __future__ import annotations

import re
import zlib

import sympy
from sympy.parsing.sympy_parser import (convert_xor, implicit_multiplication_application, parse_expr,
                                        standard_transformations)

_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox|operatorname)\{([^{}]*)\}")
_REMOVE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "~", "\\$", "$", "\\%", "%",
           "^{\\circ}", "^\\circ", "\\circ", "\\displaystyle")
_THOUSANDS = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")
_LHS = re.compile(r"^(?:[a-zA-Z]|\\[a-zA-Z]+)(?:=|\\in)")
_COMMANDS = {"pi": " pi ", "infty": " oo ", "cdot": "*", "times": "*", "div": "/", "ln": " log ", "log": " log ",
             "sin": " sin ", "cos": " cos ", "tan": " tan "}
_NAMES = {"sqrt": sympy.sqrt, "pi": sympy.pi, "oo": sympy.oo, "log": sympy.log, "sin": sympy.sin,
          "cos": sympy.cos, "tan": sympy.tan}
_SAFE_GLOBALS = {**_NAMES, **{name: getattr(sympy, name) for name in
                              ("Integer", "Float", "Rational", "Symbol", "Add", "Mul", "Pow")}, "__builtins__": {}}
_TRANSFORMS = standard_transformations + (implicit_multiplication_application, convert_xor)
_SAFE_TEXT = re.compile(r"[0-9A-Za-z+\-*/().\s]*")
_MAX_LENGTH, _MAX_EXPONENT, _TOLERANCE = 300, 1e6, 1e-9
_POINTS = 3                  # evaluation points per comparison


# ----------------------------------------------------------------------------- strings
def normalize(answer: str) -> str:
    """The answer as a canonical string (see the module docstring, step 1)."""
    text = answer.strip().replace("\n", "")
    while _WRAPPERS.search(text):
        text = _WRAPPERS.sub(r"\1", text)
    for noise in _REMOVE:
        text = text.replace(noise, "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace(" ", "").rstrip(".")
    if text.count("=") == 1 or "\\in" in text:
        text = _LHS.sub("", text)
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    text = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", text)
    text = re.sub(r"(?<![\d}])\.(\d)", r"0.\1", text)
    if re.fullmatch(r"\(?[A-E]\)?", text):            # "(C)" -> "C"
        text = text.strip("()")
    return text


def split_top(text: str) -> list[str]:
    """`text` split at its commas outside any bracket."""
    parts, depth, start = [], 0, 0
    for pos, char in enumerate(text):
        depth += (char in "([{") - (char in ")]}")
        if char == "," and depth == 0:
            parts.append(text[start:pos])
            start = pos + 1
    return parts + [text[start:]]


def _bracketed(text: str) -> tuple[str, list[str], str] | None:
    """(open, elements, close) of a tuple / interval like `(1,2]`, else None."""
    if len(text) < 2 or text[0] not in "([" or text[-1] not in ")]":
        return None
    depth = 0
    for char in text[:-1]:
        depth += (char in "([{") - (char in ")]}")
        if depth == 0:                                   # the first bracket closes before the end
            return None
    inner = split_top(text[1:-1])
    return (text[0], inner, text[-1]) if len(inner) > 1 else None


# ----------------------------------------------------------------------------- sympy
def _group(text: str, pos: int) -> tuple[str, int]:
    """The brace group (or single character) starting at `pos` -> (its content, the position after it)."""
    if text[pos] != "{":
        return text[pos], pos + 1
    depth = 0
    for end in range(pos, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return text[pos + 1:end], end + 1
    raise ValueError("unbalanced braces")


def latex_to_python(text: str) -> str:
    r"""The LaTeX subset as Python-syntax arithmetic; KeyError / ValueError / IndexError outside it."""
    out, pos = [], 0
    while pos < len(text):
        if text.startswith("\\frac", pos):
            num, pos = _group(text, pos + 5)
            den, pos = _group(text, pos)
            out.append(f"(({latex_to_python(num)})/({latex_to_python(den)}))")
        elif text.startswith("\\sqrt", pos):
            pos, root = pos + 5, None
            if text[pos] == "[":
                end = text.index("]", pos)
                root, pos = text[pos + 1:end], end + 1
            body, pos = _group(text, pos)
            body = latex_to_python(body)
            out.append(f"sqrt({body})" if root is None else f"(({body})**(1/({latex_to_python(root)})))")
        elif text[pos] == "\\":
            name = re.match(r"\\([a-zA-Z]*)", text[pos:]).group(1)
            out.append(_COMMANDS[name])
            pos += 1 + len(name)
        elif text[pos] == "{":
            body, pos = _group(text, pos)
            out.append(f"({latex_to_python(body)})")
        else:
            out.append("**" if text[pos] == "^" else text[pos])
            pos += 1
    return "".join(out)


def to_sympy(answer: str):
    """An unevaluated sympy expression of a normalised answer, or None outside the subset."""
    if len(answer) > _MAX_LENGTH:
        return None
    try:
        code = latex_to_python(answer)
    except (KeyError, ValueError, IndexError):
        return None
    names = set(re.findall(r"[A-Za-z]+", code))
    if not _SAFE_TEXT.fullmatch(code) or any(len(name) > 1 and name not in _NAMES for name in names):
        return None
    try:
        expr = parse_expr(code, local_dict={"i": sympy.I}, global_dict=dict(_SAFE_GLOBALS),
                          transformations=_TRANSFORMS, evaluate=False)
    except Exception:        # sympy's parser raises many types (SyntaxError, TokenError, TypeError, ...)
        return None
    return expr if isinstance(expr, sympy.Expr) and _bounded_exponents(expr) else None


def _bounded_exponents(expr) -> bool:
    """No numeric exponent beyond 1e6 in magnitude, checked innermost first (so evaluation stays cheap)."""
    for node in sympy.postorder_traversal(expr):
        if isinstance(node, sympy.Pow) and node.exp.is_number:
            value = complex(node.exp.evalf(15))
            if not abs(value) <= _MAX_EXPONENT:
                return False
    return True


def _point(index: int, symbols) -> dict:
    """The `index`-th point: each symbol gets a value in [1.1, 2.1) fixed by its name (no global state)."""
    return {symbol: 1.1 + zlib.crc32(f"{index}:{symbol}".encode()) / 2**32 for symbol in symbols}


def numerically_equal(a, b) -> bool:
    """Equal values at three fixed points of the free symbols (relative tolerance 1e-9)."""
    symbols = a.free_symbols | b.free_symbols
    for index in range(_POINTS):
        subs = _point(index, symbols)
        try:
            va, vb = complex(a.evalf(30, subs=subs)), complex(b.evalf(30, subs=subs))
        except (TypeError, ValueError, OverflowError, ZeroDivisionError):
            return False
        if not abs(va - vb) <= _TOLERANCE * max(1.0, abs(vb)):
            return False
    return True


# ----------------------------------------------------------------------------- the check
def is_equivalent(prediction: str | None, reference: str) -> bool:
    """Whether `prediction` (a boxed answer) states the reference answer."""
    if prediction is None:
        return False
    pred, ref = normalize(prediction), normalize(reference)
    if pred == ref:
        return True
    pred_tuple, ref_tuple = _bracketed(pred), _bracketed(ref)
    if pred_tuple or ref_tuple:
        return bool(pred_tuple and ref_tuple) and pred_tuple[0::2] == ref_tuple[0::2] and \
            len(pred_tuple[1]) == len(ref_tuple[1]) and \
            all(is_equivalent(p, r) for p, r in zip(pred_tuple[1], ref_tuple[1]))
    pred_list, ref_list = split_top(pred), split_top(ref)
    if len(pred_list) > 1 or len(ref_list) > 1:
        return _same_multiset(pred_list, ref_list)
    a, b = to_sympy(pred), to_sympy(ref)
    return a is not None and b is not None and numerically_equal(a, b)


def _same_multiset(preds: list[str], refs: list[str]) -> bool:
    """Each reference element matched by a distinct, equivalent predicted element (any order)."""
    if len(preds) != len(refs):
        return False
    remaining = list(preds)
    for ref in refs:
        match = next((p for p in remaining if is_equivalent(p, ref)), None)
        if match is None:
            return False
        remaining.remove(match)
    return True
