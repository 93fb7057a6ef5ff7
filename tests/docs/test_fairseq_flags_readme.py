"""docs/fairseq_flags.md's fairseq flag section is the table the code holds (fails until the section is pasted in).

Regenerate the section: PYTHONPATH=. python tests/config/flag_table_markdown.py, and put its
output between the two markers below in docs/fairseq_flags.md.
"""
import importlib.util
import json
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START, END = "<!-- fairseq-flags:start -->", "<!-- fairseq-flags:end -->"


def _script():
    path = os.path.join(REPO, "tests", "config", "flag_table_markdown.py")
    spec = importlib.util.spec_from_file_location("flag_table_markdown", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_fairseq_flag_section_is_generated_from_the_table():
    script = _script()
    with open(script.JSON_PATH) as f:
        expected = script.markdown(json.load(f))
    with open(os.path.join(REPO, "docs", "fairseq_flags.md")) as f:
        readme = f.read()
    assert START in readme and END in readme, f"docs/fairseq_flags.md lacks the {START} ... {END} section"
    section = readme.split(START, 1)[1].split(END, 1)[0]
    assert section.strip("\n") == expected.strip("\n"), (
        "docs/fairseq_flags.md's fairseq flag section is stale: regenerate it with "
        "PYTHONPATH=. python tests/config/flag_table_markdown.py")


def test_the_markdown_gives_every_flag_a_state():
    script = _script()
    with open(script.JSON_PATH) as f:
        text = script.markdown(json.load(f))
    assert "**no state**" not in text
    for state in ("| works |", "| accepted, ignored |", "| refused |", "accepted with `mmap`, else refused"):
        assert state in text
