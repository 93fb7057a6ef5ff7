"""A fresh venv that sees the running interpreter's installed packages: its site-packages folders
(``site.getsitepackages()`` and the user site), listed in a .pth file of the new venv.

``sys.executable -m venv --system-site-packages`` is not that when the running interpreter is itself a venv
(``sys.prefix != sys.base_prefix``, as a new user's is): the new venv's "system" is the base interpreter's,
which lacks what the user installed into their venv (pip: "No matching distribution found for
hydra-core>=1.3"). The folders are added as plain lines, after the new venv's own site-packages: what is
installed into the new venv wins, and their .pth files (an editable install's path to the source tree) are
not run. Standard library only: tests run this file as a script from another interpreter too
(``python venv_site.py NEW_VENV``).
"""
import os
import site
import subprocess
import sys
import sysconfig

PTH = "running_interpreter.pth"


def site_dirs() -> list:
    """The running interpreter's site-packages folders, in its order (a venv's own first, then its base's when
    it was made with --system-site-packages), and its user site when that is on."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def venv_site_packages(env) -> str:
    """Where the venv at ``env`` made by this interpreter keeps its packages."""
    scheme = "venv" if "venv" in sysconfig.get_scheme_names() else ("nt" if os.name == "nt" else "posix_prefix")
    return sysconfig.get_path("purelib", scheme=scheme, vars={"base": str(env), "platbase": str(env)})


def write_site_paths(env, dirs=None) -> str:
    """The .pth file in the venv at ``env`` that puts ``dirs`` (default: ``site_dirs()``) on its path."""
    path = os.path.join(venv_site_packages(env), PTH)
    with open(path, "w") as f:
        f.write("".join(f"{d}\n" for d in (site_dirs() if dirs is None else dirs)))
    return path


def make_venv(env, timeout: float = 300) -> str:
    """A venv at ``env``, without pip of its own (the running interpreter's pip runs in it: a seeded pip would
    bring an older setuptools that shadows the one torch requires), seeing the running interpreter's packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, capture_output=True,
                   timeout=timeout)
    write_site_paths(env)
    return str(env)


if __name__ == "__main__":
    make_venv(sys.argv[1])
