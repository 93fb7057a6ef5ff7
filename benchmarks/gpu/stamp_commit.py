"""The commit a GPU acceptance run tests, also on a node that gets the checkout without .git:

    python benchmarks/gpu/stamp_commit.py      # in the checkout, before copying it to the node

writes benchmarks/gpu/COMMIT (the short commit, "+dirty" when tracked files differ from it), which
run_all.py reports when git cannot answer. Where git answers, git wins: a stamp may be stale.
"""
import os
import subprocess
import sys
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STAMP = os.path.join("benchmarks", "gpu", "COMMIT")


def _git(root: str, *args: str) -> Optional[str]:
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit(root: str) -> Optional[str]:
    """The checkout's short commit, "+dirty" when tracked files were changed; None without git or .git."""
    head = _git(root, "rev-parse", "--short", "HEAD")
    if not head:
        return None
    changed = _git(root, "status", "--porcelain", "--untracked-files=no")
    return head + ("+dirty" if changed else "")


def commit(root: str) -> str:
    """git's answer, else the stamp written before the tree was copied, else "unknown"."""
    found = git_commit(root)
    if found:
        return found
    try:
        with open(os.path.join(root, STAMP)) as f:
            stamped = f.read().strip()
    except OSError:
        return "unknown"
    return f"{stamped} (stamped)" if stamped else "unknown"


def main(root: str = ROOT) -> int:
    found = git_commit(root)
    if not found:
        print(f"stamp_commit.py: error: git cannot name the commit of {root} (no git, or not a checkout); run it "
              "in the git checkout you copy to the node.", file=sys.stderr)
        return 2
    with open(os.path.join(root, STAMP), "w") as f:
        f.write(found + "\n")
    print(f"{STAMP}: {found}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
