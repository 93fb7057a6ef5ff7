"""BENCHMARKS.md opens with one table of every RESULT a benchmark prints (issue 31).

The expected names (and targets) are read from the scripts: the CPU scripts' ``RESULT name=... target<op>x``
print lines, and the GPU acceptance run's scenario results and derived ratios (benchmarks/gpu). The table is
what is checked: every such name has a row, with the script's target, and each row says met, missed or why not.
"""
import ast
import glob
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# a print may continue its f-string on the next line ("... "\n "target>=3")
PRINTED = re.compile(r"RESULT ([a-z0-9_]*(?:\{\w+\}[a-z0-9_]*)?)=(?:[^\n\"]|\"\s*\n\s*\")*?target(<=|>=|==)\{?([\w.]+)")
GPU_RESULT = re.compile(r"\(f?\"([a-z0-9_]+)\", [^()\n]*(?:\([^()\n]*\))?[^()\n]*, \"(<=|>=|==)([0-9.]+)\"\)")


def _expand(name: str, source: str):
    """A name built from one variable ({suffix}, {moments}): its values, from the loop or the flag's default."""
    match = re.search(r"\{(\w+)\}", name)
    if not match:
        return [name]
    var = match.group(1)
    loop = re.search(r"for [\w, ]*\b%s in (\(.*?\)):" % var, source, flags=re.S)
    if loop:
        values = [pair[-1] for pair in ast.literal_eval(loop.group(1))]
    else:
        values = re.search(r"\"--%s\", default=\"([^\"]+)\"" % var, source).group(1).split(",")
    return [name.replace(match.group(0), value) for value in values]


def _target(op: str, value: str, source: str) -> str:
    """The target as written in the table: a module constant resolved, a flag's default read."""
    constant = re.search(r"^%s = ([0-9.]+)" % re.escape(value), source, flags=re.M)
    flag = re.search(r"\"--%s\", type=\w+, default=([0-9.]+)" % value.replace("args.", "").replace("_", "-"),
                     source)
    return op + (constant.group(1) if constant else flag.group(1) if flag else value)


def script_results():
    """{name: target} for every RESULT a benchmark script prints."""
    found = {}
    for path in sorted(glob.glob(os.path.join(REPO, "benchmarks", "*.py"))):
        if os.path.basename(path).startswith(("mutant", "mutation_")):
            continue  # mutants are snippets of other files, not what a script prints
        with open(path) as f:
            source = f.read()
        for name, op, value in PRINTED.findall(source):
            for expanded in _expand(name, source):
                found[expanded] = _target(op, value, source)
    with open(os.path.join(REPO, "benchmarks", "gpu", "scenarios.py")) as f:
        found.update({name: op + value for name, op, value in GPU_RESULT.findall(f.read())})
    with open(os.path.join(REPO, "benchmarks", "gpu", "cases.py")) as f:
        derived = re.search(r"^DERIVED = (\[.*?\])$", f.read(), flags=re.M | re.S).group(1)
    found.update({row[0]: row[-1] for row in ast.literal_eval(derived)})
    return found


def table_rows():
    with open(os.path.join(REPO, "BENCHMARKS.md")) as f:
        text = f.read()
    start = text.index("## Every target at a glance")
    assert text.index("\n## ") >= start - 1, "the table is not the first section of BENCHMARKS.md"
    section = text[start:text.index("\n## ", start + 5)]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| `")]
    return [(re.match(r"`(\w+)`", row[0]).group(1), row) for row in rows]


def test_the_scripts_are_parsed():
    found = script_results()
    # a few written down by hand, one per way a name is built: plain, {suffix} loop, {moments} flag, GPU, derived
    for name, target in {"overhead_ratio": ">=0.97", "async_save_stall_ratio_dcp_stager": "<=0.2",
                         "ram_bytes_per_param_fp16_moments": "<=18", "mfu": ">=0.40",
                         "ac_activation_memory_reduction": ">=3",
                         "headline_uf4_gpu_peak_ratio": "<=1.10", "demo_seconds": "<=180",
                         "mutation_score": ">=0.95", "soak_cycles_survived": ">=10"}.items():
        assert found.get(name) == target, (name, found.get(name))
    assert len(found) >= 40, sorted(found)


def test_every_result_a_script_prints_has_a_row_with_its_target():
    rows = table_rows()
    for name, target in script_results().items():
        mine = [row for row_name, row in rows if row_name == name]
        assert mine, f"BENCHMARKS.md's table has no row for RESULT {name}"
        for row in mine:
            assert row[2][:2] == target[:2] and float(row[2][2:]) == float(target[2:]), (name, row, target)


def test_every_row_says_met_missed_or_why_not():
    for name, row in table_rows():
        latest, target, state, command = row[1], row[2], row[3], row[4]
        assert command.startswith("`python benchmarks/"), row
        if latest in ("pending", "not run yet"):
            assert state in ("pending", "-"), row
            continue
        value, op, bound = float(latest), target[:2], float(target[2:])
        met = {"<=": value <= bound, ">=": value >= bound, "==": value == bound}[op]
        assert state == ("met" if met else "**missed**"), row
