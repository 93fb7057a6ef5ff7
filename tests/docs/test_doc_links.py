"""Every relative link in README.md and docs/*.md names a file that exists (README's text moved to docs/)."""
import glob
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_relative_links_resolve():
    broken = []
    for path in [os.path.join(REPO, "README.md"), *glob.glob(os.path.join(REPO, "docs", "*.md"))]:
        with open(path) as f:
            links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", f.read())
        broken += [(os.path.relpath(path, REPO), link) for link in links if "://" not in link
                   and not os.path.exists(os.path.join(os.path.dirname(path), link))]
    assert not broken, broken


def test_readme_stays_short_and_links_every_docs_file():
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    assert len(text.splitlines()) <= 300
    for path in glob.glob(os.path.join(REPO, "docs", "*.md")):
        assert f"docs/{os.path.basename(path)}" in text, f"README links no docs/{os.path.basename(path)}"
