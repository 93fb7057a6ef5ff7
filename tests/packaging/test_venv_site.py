"""test_wheel.py's venv sees the running interpreter's packages, also when that interpreter is a venv whose
packages are installed in it alone (a new user's): README's test command failed there with "No matching
distribution found for hydra-core>=1.3", the venv having been made with --system-site-packages, which sees the
base interpreter's packages."""
import os
import site
import subprocess
import sys

import venv_site
import pytest

from st_testutils import scaled

HERE = os.path.dirname(os.path.abspath(__file__))


def test_the_pth_file_lists_the_interpreters_site_folders_and_its_user_site(tmp_path, monkeypatch):
    own, base, user = (tmp_path / name for name in ("venv-site", "base-site", "user-site"))
    for d in (own, base, user):
        d.mkdir()
    # a venv made with --system-site-packages: its own folder, then its base's (and one listed twice)
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(own), str(base), str(own), str(tmp_path / "none")])
    monkeypatch.setattr(site, "ENABLE_USER_SITE", True)
    monkeypatch.setattr(site, "getusersitepackages", lambda: str(user))
    env = tmp_path / "env"
    py = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (env / "lib" / py / "site-packages").mkdir(parents=True)
    path = venv_site.write_site_paths(env)
    assert path == str(env / "lib" / py / "site-packages" / "running_interpreter.pth")
    with open(path) as f:
        assert f.read() == f"{own}\n{base}\n{user}\n"  # in order, once each, only folders that exist


@pytest.mark.slow
def test_a_venv_made_from_a_venv_sees_what_is_installed_in_that_venv_only(tmp_path):
    """A user's venv (no system site-packages) holding a package the base interpreter lacks; the venv the wheel
    test makes from it finds that package."""
    users = tmp_path / "users-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(users)], check=True, timeout=scaled(120))
    py = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site_packages = users / "lib" / py / "site-packages"
    (site_packages / "only_in_users_venv").mkdir()
    (site_packages / "only_in_users_venv" / "__init__.py").write_text("WHERE = 'the user venv'\n")
    (site_packages / "only_in_users_venv-1.3.dist-info").mkdir()
    (site_packages / "only_in_users_venv-1.3.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: only-in-users-venv\nVersion: 1.3\n")
    new = tmp_path / "new-venv"
    subprocess.run([str(users / "bin" / "python"), os.path.join(HERE, "venv_site.py"), str(new)], check=True,
                   timeout=scaled(120))
    probe = ("import importlib.metadata as m, only_in_users_venv as p, sys; "
             "print(m.version('only-in-users-venv'), p.WHERE, sys.prefix, sep='|')")
    done = subprocess.run([str(new / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                          timeout=scaled(120), env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"1.3|the user venv|{new}"
