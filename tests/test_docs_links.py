"""The README is a front page and the docs stand alone: every relative link resolves inside the repository."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(path: Path) -> list[str]:
    targets = [t for t in LINK.findall(path.read_text()) if not re.match(r"(https?:|mailto:|#)", t)]
    return [t.split("#", 1)[0] for t in targets]


def test_docs_exist():
    assert {p.name for p in DOCS} >= {"README.md", "usage.md", "results.md", "kernels.md", "architecture.md",
                                      "method.md"}


def test_every_relative_link_resolves():
    dangling = [f"{path.relative_to(ROOT)}: {target}" for path in DOCS for target in relative_links(path)
                if not (path.parent / target).exists()]
    assert not dangling, "dangling links:\n" + "\n".join(dangling)


def test_links_stay_inside_the_repository():
    outside = [f"{path.relative_to(ROOT)}: {target}" for path in DOCS for target in relative_links(path)
               if ROOT.resolve() not in (path.parent / target).resolve().parents]
    mentions = [str(path.relative_to(ROOT)) for path in DOCS if "../shared" in path.read_text()]
    assert not outside and not mentions, outside + mentions


def test_readme_is_a_front_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
