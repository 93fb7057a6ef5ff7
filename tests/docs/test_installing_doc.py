"""docs/installing.md quoted "1,688 tests" long after the suite had grown past it: it quotes no count of tests
(which goes stale with the next test), and says how to count them instead."""
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_installing_quotes_no_test_count_and_says_how_to_count():
    with open(os.path.join(REPO, "docs", "installing.md")) as f:
        text = f.read()
    assert not re.findall(r"\b\d[\d,]* (?:tests\b|on 20\d\d)", text)  # "1,688 tests", "1,311 on 2026-11-25"
    assert "`python -m pytest --collect-only -q tests | tail -1` counts it" in text
