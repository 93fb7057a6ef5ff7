"""A stand-in for an air-gapped node's Python: a fresh venv that sees some of the running interpreter's
installed packages (its torch above all) and nothing else, and the node's pip environment.

The packages are a folder of symlinks, put on the venv's path by a .pth file: pip sees their
dist-info as installed, nothing of GBs is copied, and pip cannot replace them (they lie outside the
venv). pip's resolver checks the requirements of installed packages too. A node installed torch with
its CUDA libraries; a test machine's torch may lack them (CI's torch 2.11 comes without) or disagree
with its setuptools, so the node's dist-info lists only the requirements this machine meets.
"""
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

from shardtrain.cli.wheelhouse import canonical
from st_testutils import scaled

SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"


def run(args, env, cwd, timeout=300):
    """A command's output; a failure shows what it printed."""
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=scaled(timeout))
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def node_env(**extra):
    """The node's environment: no index, none of this machine's pip configuration (its find-links
    hold a torch wheel), no PYTHONPATH unless given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", **extra}


def _active(req: Requirement, extras) -> bool:
    return req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras | {""})


def installed_closure(roots) -> dict:
    """The running interpreter's distributions that ``roots`` need, requirements followed with their
    markers and extras: {canonical name: (distribution, extras asked of it)}."""
    found, todo = {}, [(r, frozenset()) for r in roots]
    while todo:
        name, extras = todo.pop()
        key = canonical(name)
        if key in found and extras <= found[key][1]:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here: the node's dist-info will not ask for it (make_node)
        extras = extras | found.get(key, (None, frozenset()))[1]
        found[key] = (dist, extras)
        todo += [(r.name, frozenset(r.extras)) for r in map(Requirement, dist.requires or []) if _active(r, extras)]
    return found


def _seen_by_pip(line: str, extras, found) -> bool:
    """A Requires-Dist line left in the node's dist-info: inactive here, or met by what is installed."""
    req = Requirement(line.split(":", 1)[1].strip())
    dist = found.get(canonical(req.name), (None,))[0]
    return not _active(req, extras) or (dist is not None and req.specifier.contains(dist.version, prereleases=True))


def make_node(where: Path, roots) -> Path:
    """A folder of symlinks to ``roots`` and everything they need, as installed here."""
    found = installed_closure(roots)
    where.mkdir()
    for dist, extras in found.values():
        for top in {f.parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            if top.endswith(".pth") or os.path.lexists(where / top):
                continue  # .pth: no start-up code of theirs; a shared namespace folder is linked once
            lines = dist.read_text("METADATA").splitlines(keepends=True) if top.endswith(".dist-info") else []
            kept = [l for l in lines if not l.startswith("Requires-Dist:") or _seen_by_pip(l, extras, found)]
            if kept == lines:
                (where / top).symlink_to(dist.locate_file(top))
            else:
                shutil.copytree(dist.locate_file(top), where / top)
                (where / top / "METADATA").write_text("".join(kept))
    return where


def make_venv(where: Path, node: Path) -> Path:
    """A fresh venv (no system site-packages) that sees ``node`` through a .pth file."""
    run([sys.executable, "-m", "venv", "--without-pip", where], env=node_env(), cwd=where.parent)
    (where / SITE / "node.pth").write_text(f"{node}\n")
    return where


PROBE = """
import importlib.metadata as m, importlib.util as u, json, os, sys
def where(name):
    try:
        return [m.version(name), str(m.distribution(name).locate_file(""))]
    except m.PackageNotFoundError:
        return None
origin = u.find_spec("torch").origin  # found, not imported: seconds saved
stat = os.stat(origin)
print(json.dumps({"torch": [m.version("torch"), os.path.realpath(origin), stat.st_ino, stat.st_mtime_ns],
                  **{name: where(name) for name in sys.argv[1:]}}))
"""


def probe(python: Path, names) -> dict:
    """Where the venv finds torch (version, file, inode, mtime) and ``names`` ([version, folder], or
    None: not installed)."""
    return json.loads(run([python, "-c", PROBE, *sorted(names)], env=node_env(), cwd=python.parent))
