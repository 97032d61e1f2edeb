"""The README is a front page and the docs stand alone: every relative link resolves inside the repository,
and no page points at files outside it (no `../shared`, no absolute paths)."""
import re
import sys
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 150
EXPECTED_DOCS = {"usage.md", "results.md", "kernels.md", "architecture.md", "method.md", "known_limits.md"}

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)        # fenced code blocks
INLINE_CODE = re.compile(r"`[^`\n]*`")
INLINE_TARGET = re.compile(r"\]\(\s*(<[^>\n]*>|[^)\s]+)")           # the target of [text](...) and ![alt](...)
REFERENCE_TARGET = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*(<[^>\n]*>|\S+)", re.M)   # [label]: target
SKIPPED_TARGET = re.compile(r"(https?://|mailto:|#)", re.I)
# An absolute filesystem path: a '/' that starts a token (not inside a word, URL or a/b) followed by a name.
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~$}>\-\]])/(?:[A-Za-z0-9_.\-]+)(?:/[A-Za-z0-9_.*\-]*)*")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def link_targets(text: str) -> list[str]:
    """Relative targets of inline, image and reference links, outside code, with any #fragment removed."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    targets = [t.strip("<>").strip() for t in INLINE_TARGET.findall(prose) + REFERENCE_TARGET.findall(prose)]
    return [unquote(t.split("#", 1)[0]) for t in targets if t and not SKIPPED_TARGET.match(t)]


def dangling_links(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}: ({target})" for target in link_targets(path.read_text())
            if not (path.parent / target).exists()]


def links_leaving_repo(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}: ({target}) resolves outside the repository"
            for target in link_targets(path.read_text())
            if ROOT != (path.parent / target).resolve() and ROOT not in (path.parent / target).resolve().parents]


def outside_references(path: Path) -> list[str]:
    """`../shared` anywhere, and absolute paths in prose or code (commands included)."""
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if "../shared" in line:
            found.append(f"{path.relative_to(ROOT)}:{number}: ../shared")
        found += [f"{path.relative_to(ROOT)}:{number}: {match}" for match in ABSOLUTE_PATH.findall(line)]
    return found


def test_docs_exist():
    assert EXPECTED_DOCS <= {p.name for p in (ROOT / "docs").glob("*.md")}


def test_every_relative_link_resolves():
    dangling = [entry for path in markdown_files() for entry in dangling_links(path)]
    assert not dangling, "dangling links:\n" + "\n".join(dangling)


def test_every_doc_is_linked_from_the_readme():
    linked = {(ROOT / t).resolve() for t in link_targets((ROOT / "README.md").read_text())}
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"docs/ pages the README does not link: {missing}"


def test_no_reference_outside_the_repository():
    outside = [entry for path in markdown_files() for entry in links_leaving_repo(path) + outside_references(path)]
    assert not outside, "references outside the repository:\n" + "\n".join(outside)


def test_readme_is_a_front_page():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}); move detail to docs/"


def test_the_checks_catch_bad_pages(tmp_path, monkeypatch):
    """A page with a dangling link, an image outside the repo, ../shared and an absolute path is caught;
    URLs, anchors, fragments and links inside code are not."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "ok.md").write_text("ok\n")
    page = tmp_path / "docs" / "bad.md"
    page.write_text("[a](ok.md#part) [b](https://example.org) [c](#top) [d](mailto:x@y.z) `[e](nowhere.md)`\n"
                    "[gone](missing.md) ![img](../../outside.png)\n[ref]: also_missing.md\n"
                    "see ../shared/docs/GPU.md and /etc/passwd; 1/128k, a/b and <dir>/x are fine\n")
    assert dangling_links(page) == ["docs/bad.md: (missing.md)", "docs/bad.md: (../../outside.png)",
                                    "docs/bad.md: (also_missing.md)"]
    assert links_leaving_repo(page) == ["docs/bad.md: (../../outside.png) resolves outside the repository"]
    assert outside_references(page) == ["docs/bad.md:4: ../shared", "docs/bad.md:4: /etc/passwd"]
