"""The README's opening gives the commands a newcomer runs first, and they exist.

The options are documented in the generated docs/reference/configuration.md (checked by tests/unit/docs); the CPU
harness's patches in docs/development.md (tests/unit/test_doc_pages.py)."""

import re
from repo_paths import REPO as ROOT

README = (ROOT / "README.md").read_text()


def test_opening_gives_the_two_commands():
    opening = "\n".join(README.splitlines()[:40])
    assert "make demo" in opening and "make test" in opening
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_opening_shows_tiny_ppo_as_the_way_to_try_any_rm():
    opening = "\n".join(README.splitlines()[:40])
    assert "verl-vllm-rm tiny-ppo --rm" in opening


def _nav_pages() -> set[str]:
    """The pages of the site's nav (mkdocs.yml), relative to docs/."""
    return set(re.findall(r"^\s+- (?:[^:\n]+: )?([\w/]+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M))


def test_the_map_of_the_docs_links_every_page_and_every_link_resolves():
    links = re.findall(r"\]\(((?!https?://)[^)#\s]+)(?:#[^)]*)?\)", README)
    assert links, "no relative links in the README"
    nav = _nav_pages()
    assert {"index.md", "quickstart.md", "troubleshooting.md"} <= nav, nav
    for link in links:
        # docs/reference/*.md are generated (make docs): their names are the nav's
        assert (ROOT / link).is_file() or (link.startswith("docs/reference/") and link[5:] in nav), link
    docs_map = README[README.index("## The documentation\n"):]
    mapped = set(re.findall(r"^\| \[[^]]+\]\(([^)#]+)\) \|", docs_map.split("\n## ")[0], re.M))
    assert mapped == {f"docs/{page}" for page in nav}, "the README's map of the docs is not the site's nav"
