"""Build a folder of wheels that installs shardtrain on an air-gapped node beside the node's own torch.

    python -m shardtrain.cli.wheelhouse --python-version 3.12 --platform manylinux_2_28_x86_64 \\
        --dest DIR [--exclude tensorboard,sentencepiece,numpy,tqdm]

Run it from a checkout, on a machine that reaches the package index: shardtrain need not be installed
and nothing here imports torch. DIR receives shardtrain's own wheel and wheels of its dependencies
(as pyproject.toml states them, read back from the built wheel's metadata, so there is no second
list) and of theirs, for the node's Python and platform. torch and its CUDA libraries are never
included: the node keeps its own. ``--exclude`` leaves out what the node already has. A package
published only as a source distribution (antlr4-python3-runtime 4.9.3, which hydra-core and omegaconf
pin) is built into a wheel here (pure Python: it serves any platform). The folder is filled under a
temporary name and renamed only when complete, so a failure leaves no half-filled DIR. The command to
run on the node is printed: ``python -m pip install --no-index --find-links DIR shardtrain``, which
keeps an installed torch that satisfies shardtrain's range (with no index, pip has no other torch).
"""
import argparse
import contextlib
import email
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import List, Sequence

from shardtrain.cli.errors import cli_entry
from shardtrain.core.errors import ShardtrainError

CHECKOUT = Path(__file__).resolve().parents[2]
# torch and what only torch pulls in: the node's own copies must stay, so no wheel of them ever goes in.
TORCH_STACK = re.compile(r"^(torch|triton|pytorch-triton|nvidia-.*|cuda-.*)$")
NOT_SOURCE = (".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".wheelhouse-*")
LINUX_ARCHES = ("x86_64", "aarch64", "i686", "ppc64le", "s390x", "armv7l", "riscv64")
# The old manylinux names and the glibc each stands for.
LEGACY_MANYLINUX = {"manylinux1": 5, "manylinux2010": 12, "manylinux2014": 17}
PLATFORM_EXAMPLES = "manylinux_2_28_x86_64, manylinux2014_aarch64, musllinux_1_2_x86_64, macosx_11_0_arm64, win_amd64"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return canonical(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def wheel_name(filename: str) -> str:
    return canonical(filename.split("-")[0])


def python_version(text: str) -> str:
    """``3.12`` or ``312`` -> ``3.12``."""
    match = re.fullmatch(r"3\.?(\d{1,2})", text.strip())
    if not match:
        raise ShardtrainError(f"--python-version {text!r} is not a CPython 3 version: give it as 3.12 (or 312), "
                              "the version of the node's python (python -c 'import sys; print(sys.version)').")
    return f"3.{int(match.group(1))}"


def platform_tags(platform: str) -> List[str]:
    """Every platform tag a node of ``platform`` installs, newest first: pip matches ``--platform``
    literally, and manylinux_2_28 names no older glibc, so a wheel tagged only manylinux2014 (grpcio,
    protobuf) would not be found. macOS tags pip widens itself."""
    linux = re.fullmatch(r"(manylinux|musllinux)_(\d+)_(\d+)_(\w+)", platform)
    legacy = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_(\w+)", platform)
    if legacy:
        linux = re.fullmatch(r"(manylinux)_(\d+)_(\d+)_(\w+)", f"manylinux_2_{LEGACY_MANYLINUX[legacy[1]]}_{legacy[2]}")
    if linux and linux[4] in LINUX_ARCHES and (linux[1], linux[2]) in {("manylinux", "2"), ("musllinux", "1")}:
        kind, major, minor, arch = linux[1], linux[2], int(linux[3]), linux[4]
        tags = [f"{kind}_{major}_{m}_{arch}" for m in range(minor, 4 if kind == "manylinux" else -1, -1)]
        return tags + [f"{old}_{arch}" for old, m in LEGACY_MANYLINUX.items() if kind == "manylinux" and m <= minor]
    if re.fullmatch(r"macosx_\d+_\d+_\w+|win32|win_amd64|win_arm64|linux_(" + "|".join(LINUX_ARCHES) + ")", platform):
        return [platform]
    raise ShardtrainError(f"--platform {platform!r} is not a wheel platform tag pip knows: give the node's, "
                          f"e.g. {PLATFORM_EXAMPLES} (a glibc 2.28 x86_64 Linux is manylinux_2_28_x86_64; "
                          "on the node, 'ldd --version' shows glibc and 'uname -m' the architecture).")


def download_args(requirements: Sequence[str], version: str, platforms: Sequence[str], wheels: str) -> List[str]:
    """pip's arguments that fetch ``requirements`` and their dependencies as wheels for the node."""
    args = ["download", "--only-binary=:all:", "--implementation", "cp", "--python-version", version]
    for tag in platforms:
        args += ["--platform", tag]
    # --find-links: the wheels built here from source distributions stand in for what the index lacks.
    return args + ["--find-links", wheels, "--dest", wheels, *requirements]


def pip(args: Sequence[str], what: str) -> str:
    """Run this interpreter's pip; a failure is one paragraph with pip's own error lines."""
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR")] or lines[-3:]
        raise ShardtrainError(f"{what} failed (pip exited {done.returncode}: {' '.join(errors)}). The wheelhouse "
                              "is built on a machine that reaches the package index (check the network and pip's "
                              "index settings); --dest was not created.")
    return done.stdout


def own_wheel(work: Path, dest: Path) -> Path:
    """shardtrain's wheel, built from a copy of the checkout (setuptools writes build/ into its source)."""
    source = work / "source"
    skip = shutil.ignore_patterns(*NOT_SOURCE)
    shutil.copytree(CHECKOUT, source, ignore=lambda d, names: set(skip(d, names)) | (
        {dest.name} if Path(d).resolve() == dest.parent else set()))
    pip(["wheel", "--no-deps", "-q", "--wheel-dir", str(work / "wheels"), str(source)], "building shardtrain's wheel")
    (wheel,) = (work / "wheels").glob("shardtrain-*.whl")
    return wheel


def requirements_of(wheel: Path) -> List[str]:
    """The wheel's Requires-Dist: pyproject.toml's dependencies, as the wheel states them."""
    with zipfile.ZipFile(wheel) as z:
        (metadata,) = [n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        return email.message_from_bytes(z.read(metadata)).get_all("Requires-Dist") or []


def node_needs(requirements: Sequence[str], exclude: set) -> List[str]:
    """The requirements the wheelhouse serves: not the optional extras, never torch's stack, not what
    the node already has."""
    return [r for r in requirements if not re.search(r";.*\bextra\s*==", r)
            and not TORCH_STACK.match(requirement_name(r)) and requirement_name(r) not in exclude]


def build_source_only(requirements: Sequence[str], work: Path) -> None:
    """Wheels of the packages in the dependency tree that the index holds only as source distributions.
    pip resolves the tree for this machine (a dry run reads metadata, downloads nothing big) and each
    source-only package is built here. The download then takes such a wheel only where the node's tags
    accept it (pure Python, as antlr4's); a compiled one for another platform ends in pip's error."""
    report = work / "report.json"
    pip(["install", "--dry-run", "--ignore-installed", "-q", "--report", str(report), *requirements],
        "resolving the dependencies")
    for item in json.loads(report.read_text())["install"]:
        if not item["download_info"]["url"].endswith(".whl"):
            name, version = item["metadata"]["name"], item["metadata"]["version"]
            pip(["wheel", "--no-deps", "-q", "--wheel-dir", str(work / "wheels"), f"{name}=={version}"],
                f"building a wheel of {name} {version} (published only as source)")


def prune(wheels: Path, exclude: set) -> set:
    """Remove torch's stack and the excluded packages; returns the excluded names found."""
    found = set()
    for path in wheels.iterdir():
        name = wheel_name(path.name)
        if TORCH_STACK.match(name) or name in exclude or not path.name.endswith(".whl"):
            found |= {name} & exclude
            path.unlink()
    return found


def fill(work: Path, dest: Path, version: str, platforms: Sequence[str], exclude: set) -> None:
    """Fill work/wheels, with a requirements.txt of what it serves (for a checkout run uninstalled)."""
    requirements = requirements_of(own_wheel(work, dest))
    kept = node_needs(requirements, exclude)
    if kept:
        build_source_only(kept, work)
        pip(download_args(kept, version, platforms, str(work / "wheels")),
            f"downloading wheels for CPython {version} on {platforms[0]}")
    found = prune(work / "wheels", exclude) | {requirement_name(r) for r in requirements} & exclude
    if exclude - found:
        print(f"note: --exclude named what nothing here requires (a typo?): {', '.join(sorted(exclude - found))}")
    (work / "wheels" / "requirements.txt").write_text("".join(f"{r}\n" for r in kept))


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m shardtrain.cli.wheelhouse", description=__doc__.split("\n")[0])
    parser.add_argument("--python-version", required=True, help="the node's Python, e.g. 3.12")
    parser.add_argument("--platform", required=True, help=f"the node's wheel platform tag, e.g. {PLATFORM_EXAMPLES}")
    parser.add_argument("--dest", required=True, help="the folder to create (absent or empty)")
    parser.add_argument("--exclude", default="", help="comma-separated packages the node already has, "
                        "e.g. tensorboard,sentencepiece,numpy,tqdm (torch is never included)")
    return parser.parse_args(argv)


@cli_entry("wheelhouse")
def main(argv: List[str]) -> None:
    args = parse_args(argv)
    version, platforms = python_version(args.python_version), platform_tags(args.platform)
    exclude = {canonical(n) for n in args.exclude.split(",") if n.strip()}
    dest = Path(args.dest).resolve()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ShardtrainError(f"--dest {args.dest} exists and is not an empty folder: give a new one "
                              "(nothing in it was changed).")
    if not (CHECKOUT / "pyproject.toml").is_file():
        raise ShardtrainError(f"{CHECKOUT} is not a checkout (no pyproject.toml): run this module from a clone "
                              "of shardtrain's source, where its wheel is built.")
    made = missing_parents(dest)
    try:
        work = work_folder(dest, args.dest)
        try:
            fill(work, dest, version, platforms, exclude)
            if dest.exists():
                dest.rmdir()
            (work / "wheels").rename(dest)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        for folder in made:  # innermost first: a failed run leaves no folder it made
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    report(args.dest, version, args.platform)


def missing_parents(dest: Path) -> List[Path]:
    """The folders above ``dest`` that do not exist yet, innermost first."""
    return [p for p in dest.parents if not os.path.lexists(p)]


def work_folder(dest: Path, given: str) -> Path:
    """A new temporary folder beside ``dest`` (same file system: the final rename is atomic), making
    dest's missing parents; a folder that cannot be written to is one paragraph."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".wheelhouse-", dir=dest.parent))
    except OSError as e:
        where = next(p for p in dest.parents if os.path.lexists(p))  # the folder that refused
        raise ShardtrainError(f"Cannot create --dest {given} in {where}: {e.strerror} (a read-only "
                              "folder or mount, or no write permission for this user). The wheelhouse is filled "
                              "under a temporary name beside DIR and renamed when complete, so DIR's folder must be "
                              "writable: choose a --dest in a folder you can write to, or make it writable; nothing "
                              "was written.") from None


def report(dest: str, version: str, platform: str) -> None:
    wheels = sorted(p for p in Path(dest).iterdir() if p.suffix == ".whl")
    size = sum(p.stat().st_size for p in wheels) / 2**20
    folder = shlex.quote(dest)
    print(f"{dest}: {len(wheels)} wheels, {size:.1f} MiB, for CPython {version} on {platform}; no torch.")
    print("On the node, with no index (its torch, which satisfies shardtrain's range, is left as it is):")
    print(f"  python -m pip install --no-index --find-links {folder} shardtrain")
    print("Or, to run from a checkout with PYTHONPATH=CHECKOUT instead, install only the dependencies:")
    requirements = shlex.quote(os.path.join(dest, "requirements.txt"))
    print(f"  python -m pip install --no-index --find-links {folder} -r {requirements}")
    # pip's resolver checks what is installed too: a node whose torch asks for what the node lacks
    # (torch 2.11 pins setuptools<82) fails the first command; this one installs without resolving.
    print("If pip reports a conflict among the node's own packages (e.g. torch's setuptools), install the "
          "folder's wheels as they are:")
    print(f"  python -m pip install --no-index --no-deps {folder}/*.whl")


if __name__ == "__main__":
    main()
