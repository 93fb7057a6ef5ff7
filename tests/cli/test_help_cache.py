"""The --help cache (issue 37): every input of the help text is in the key, by content; any argument and
any plugin folder answer with help, never a traceback; only a help that succeeded is kept; an entry is
checked before it is printed. The key's inputs are pinned one by one (tests/cli/test_start_messages.py
holds the answer-without-torch half)."""
import hashlib
import os
import subprocess
import sys

import pytest

from shardtrain.cli import entry, help_cache, help_key
from st_testutils import scaled

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOT_UTF8 = os.fsdecode(b"\xff")  # how Python hands over an argument byte that is not UTF-8


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(help_cache.ENV_DIR, str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "path", list(sys.path))  # --user-dir adds its parent folder
    return tmp_path / "cache" / "help"


def same_size_edit(path, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` (as long) and give the file its modification time back, as ``cp -p``,
    ``rsync -t`` or an edit within the clock's resolution leave it."""
    assert len(old) == len(new)
    stat = os.stat(path)
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(path).st_size == stat.st_size


def run_help(monkeypatch, capsys, prog, *argv):
    """entry.run as the console script: (exit status, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", [prog, *argv])
    try:
        code = entry.run(prog)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code or 0, out, err


def test_an_argument_that_is_not_utf8_gets_help_from_every_command(cache, monkeypatch, capsys):
    for prog in entry.COMMANDS:
        code, out, err = run_help(monkeypatch, capsys, prog, NOT_UTF8, "--help")
        assert (code, out.startswith("usage: "), "Traceback" in err) == (0, True, False), (prog, err[-2000:])
    first = run_help(monkeypatch, capsys, "shard-train", NOT_UTF8, "--help")
    monkeypatch.setattr(entry.importlib, "import_module", lambda name: pytest.fail(f"imported {name}"))
    assert run_help(monkeypatch, capsys, "shard-train", NOT_UTF8, "--help") == first  # from the cache
    assert help_key.key("shard-train", [NOT_UTF8]) != help_key.key("shard-train", [os.fsdecode(b"\xfe")])


def test_a_dangling_symlink_in_the_user_dir(cache, tmp_path, monkeypatch, capsys):
    """A file the plugin never imports is Python's business, not ours: help, exit 0, cached. A plugin that
    imports it cannot work: one paragraph, exit 2, as for any plugin that fails to import, and no cache."""
    plugin = tmp_path / f"hc_dangling_{os.getpid()}"
    plugin.mkdir()
    (plugin / "__init__.py").write_text("x = 1\n")
    os.symlink(tmp_path / "gone.py", plugin / "gone.py")
    code, out, err = run_help(monkeypatch, capsys, "shard-train", "--user-dir", str(plugin), "--help")
    assert (code, out.startswith("usage: shard-train"), err.count("Traceback")) == (0, True, 0), err[-2000:]
    assert len(os.listdir(cache)) == 1
    dangling = help_key.key("shard-train", ["--user-dir", str(plugin)])
    (tmp_path / "gone.py").write_text("y = 2\n")  # the link mended: its target is read
    assert help_key.key("shard-train", ["--user-dir", str(plugin)]) != dangling

    broken = tmp_path / f"hc_imports_dangling_{os.getpid()}"
    broken.mkdir()
    (broken / "__init__.py").write_text("from . import gone\n")
    os.symlink(tmp_path / "nowhere.py", broken / "gone.py")
    code, out, err = run_help(monkeypatch, capsys, "shard-train", f"--user-dir={broken}", "--help")
    assert (code, out, err.count("\n"), "Traceback" in err) == (2, "", 1, False), err[-2000:]
    assert f"shard-train: error: --user-dir {broken} failed to import: ImportError" in err
    assert len(os.listdir(cache)) == 1  # the failure was not kept


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A stand-in for shardtrain's folder (the real one is shared with other work in progress)."""
    root = tmp_path / "pkg"
    (root / "config" / "recipes").mkdir(parents=True)
    (root / "config" / "sections.py").write_text("LR = 0.25\n")
    (root / "config" / "recipes" / "lm_small.yaml").write_text("optimization:\n  lr: [0.25]\n")
    (root / "README.md").write_text("not code\n")
    monkeypatch.setattr(help_key, "PACKAGE_DIR", str(root))
    return root


def test_a_same_size_edit_of_shardtrains_code_or_recipes_makes_a_new_key(cache, package):
    argv = ["--help"]
    help_cache.store("shard-hydra-train", argv, "usage: shard-hydra-train\n")
    assert help_cache.lookup("shard-hydra-train", argv) == "usage: shard-hydra-train\n"
    before = help_key.key("shard-hydra-train", argv)
    (package / "README.md").write_text("still not code, another size\n")
    assert help_key.key("shard-hydra-train", argv) == before  # not an input of the help

    same_size_edit(package / "config" / "recipes" / "lm_small.yaml", "0.25", "0.75")
    assert help_cache.lookup("shard-hydra-train", argv) is None  # the stale entry is not found
    after_recipe = help_key.key("shard-hydra-train", argv)
    same_size_edit(package / "config" / "sections.py", "0.25", "0.75")
    assert len({before, after_recipe, help_key.key("shard-hydra-train", argv)}) == 3
    (package / "config" / "recipes" / "lm_big.yaml").write_text("{}\n")  # a new recipe: a new name in help
    assert help_key.key("shard-hydra-train", argv) not in (before, after_recipe)


def test_every_user_dir_form_is_keyed_by_content(tmp_path, monkeypatch):
    first, last = tmp_path / "first", tmp_path / "last"
    for folder in (first, last):
        folder.mkdir()
        (folder / "__init__.py").write_text("ALPHA = 1\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    forms = [["--user-dir=" + str(last), "--help"],
             ["--user-dir", str(last), "--help"],
             ["--user-dir", str(first), "--user-dir=" + str(last), "--help"],  # argparse imports the last
             ["--user-dir=~/last", "--help"]]  # no shell expands ~ after '=': import_user_dir does
    before = [help_key.key("shard-train", argv) for argv in forms]
    same_size_edit(last / "__init__.py", "ALPHA", "BETAA")
    after = [help_key.key("shard-train", argv) for argv in forms]
    assert [b != a for b, a in zip(before, after)] == [True, True, True, True]
    assert help_key.user_dirs(forms[2]) == [str(first), str(last)]
    assert help_key.user_dirs(forms[3]) == [str(last)]


def test_installed_plugins_are_keyed_by_their_files_only(tmp_path, monkeypatch):
    import importlib
    import importlib.metadata

    site = tmp_path / "site"
    (site / "hc_installed_pkg").mkdir(parents=True)
    (site / "hc_installed_pkg" / "__init__.py").write_text("")
    (site / "hc_installed_pkg" / "models.py").write_text("WIDTH = 16\n")
    (site / "hc_installed_pkg" / "layers.py").write_text("HEADS = 16\n")  # beside the entry point's module
    (site / "hc_single_module.py").write_text("DEPTH = 16\n")
    (site / "unrelated.py").write_text("X = 16\n")  # another package of site-packages
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    points = [importlib.metadata.EntryPoint("models", "hc_installed_pkg.models:register", "shardtrain.plugins"),
              importlib.metadata.EntryPoint("single", "hc_single_module:register", "shardtrain.plugins")]
    monkeypatch.setattr(help_key.importlib.metadata, "entry_points",
                        lambda group: points if group == "shardtrain.plugins" else [])
    keys = [help_key.key("shard-train", ["--help"])]
    same_size_edit(site / "hc_installed_pkg" / "models.py", "16", "32")
    keys.append(help_key.key("shard-train", ["--help"]))
    same_size_edit(site / "hc_single_module.py", "16", "32")
    keys.append(help_key.key("shard-train", ["--help"]))
    same_size_edit(site / "unrelated.py", "16", "32")  # not walked: site-packages may hold thousands of files
    keys.append(help_key.key("shard-train", ["--help"]))
    same_size_edit(site / "hc_installed_pkg" / "layers.py", "16", "32")  # the whole package is walked
    keys.append(help_key.key("shard-train", ["--help"]))
    assert len(set(keys)) == 4 and keys[2] == keys[3]


def test_versions_and_argument_boundaries_are_in_the_key(monkeypatch):
    assert help_key.key("shard-train", ["--lr", "1x"]) != help_key.key("shard-train", ["--lr1", "x"])
    before = help_key.key("shard-train", ["--help"])
    monkeypatch.setattr(help_key, "_version", lambda distribution: "0.0.1")
    assert help_key.key("shard-train", ["--help"]) != before
    monkeypatch.undo()
    monkeypatch.setattr(help_key.sys, "version", "3.99.0 (main)")
    assert help_key.key("shard-train", ["--help"]) != before


def test_a_failed_help_is_never_kept(cache):
    with pytest.raises(RuntimeError):
        with help_cache.recording("shard-train", ["--help"]):
            print("usage: shard-train")
            raise RuntimeError("a plugin's bug, after the first line")
    with pytest.raises(SystemExit):
        with help_cache.recording("shard-train", ["--help"]):
            print("usage: shard-train")
            sys.exit(2)
    assert not cache.exists() or os.listdir(cache) == []


def test_a_help_cut_short_by_a_failed_write_is_never_kept(cache, monkeypatch):
    """argparse's print_help ignores an OSError (a full disk, a closed pipe) and exits 0 all the same."""
    class FailsSecondWrite:
        writes = 0

        def write(self, text):
            self.writes += 1
            if self.writes == 2:
                raise OSError(28, "No space left on device")
            return len(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", FailsSecondWrite())
    with pytest.raises(SystemExit):
        with help_cache.recording("shard-train", ["--help"]):
            sys.stdout.write("usage: shard-train\n")
            try:
                sys.stdout.write("options:\n  --lr LR\n")
            except OSError:
                pass  # as argparse does
            sys.exit(0)
    assert not cache.exists() or os.listdir(cache) == []


def test_a_damaged_or_planted_entry_is_never_printed(cache, monkeypatch, capsys):
    argv = ["--optimizer", "sgd", "--help"]
    code, good, _ = run_help(monkeypatch, capsys, "shard-train", *argv)
    assert code == 0 and "--momentum" in good
    name = help_key.key("shard-train", argv)
    path = cache / (name + ".txt")
    stored = path.read_bytes()
    header = f"shardtrain-help-cache 2 {name} ".encode()
    assert stored == header + hashlib.sha256(good.encode()).hexdigest().encode() + b"\n" + good.encode()
    assert help_cache.lookup("shard-train", argv) == good

    def signed(body: bytes) -> bytes:
        return header + hashlib.sha256(body).hexdigest().encode() + b"\n" + body

    escape = "usage: shard-train\n\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x1b[0m\n".encode()
    bad = {"escape codes, hash right": signed(escape),
           "a carriage return": signed(b"usage: shard-train\rok\n"),
           "a bidi override": signed("usage: \u202eniart-drahs\n".encode()),
           "text changed after writing": stored.replace(b"--momentum", b"--momentux"),
           "truncated": stored[:len(stored) // 2],
           "written before the header (today's format)": good.encode(),
           "another key's entry": stored.replace(name.encode(), b"0" * 32, 1),
           "not UTF-8": signed(b"usage: \xff\n"),
           "empty": b""}
    for what, data in bad.items():
        path.write_bytes(data)
        assert help_cache.lookup("shard-train", argv) is None, what
        assert not path.exists(), what  # discarded
    path.write_bytes(signed(escape))
    code, out, _ = run_help(monkeypatch, capsys, "shard-train", *argv)
    assert (code, out) == (0, good)  # built again, and kept again
    assert path.read_bytes() == stored


@pytest.mark.slow
def test_help_a_plugin_gives_through_the_equals_form_follows_a_same_size_edit(tmp_path):
    """End to end, two processes (a registry never takes a name twice in one): the new option is listed."""
    plugin = tmp_path / "hc_opt_plugin"
    plugin.mkdir()
    (plugin / "__init__.py").write_text(
        "import dataclasses\n\nimport torch\n\nfrom shardtrain.core.fields import field\n"
        "from shardtrain.optim.registry import OptimizerSpec, register_optimizer\n\n\n"
        "@dataclasses.dataclass\nclass HcConfig:\n    alpha_one: float = field(0.5, help='the first knob')\n\n\n"
        "@register_optimizer('hc_opt', dataclass=HcConfig)\ndef hc_opt(cfg, device):\n"
        "    return OptimizerSpec(torch.optim.SGD, {})\n")
    env = dict(os.environ, PYTHONPATH=REPO, COLUMNS="100", **{help_cache.ENV_DIR: str(tmp_path / "cache")})
    script = "from shardtrain.cli.entry import shard_train; import sys; sys.argv[0] = 'shard-train'; shard_train()"
    argv = [sys.executable, "-c", script, f"--user-dir={plugin}", "--optimizer", "hc_opt", "--help"]
    run = lambda: subprocess.run(argv, capture_output=True, text=True, env=env, timeout=scaled(120))  # noqa: E731
    first = run()
    assert first.returncode == 0 and "--alpha-one" in first.stdout, first.stderr[-2000:]
    same_size_edit(plugin / "__init__.py", "alpha_one", "alpha_two")
    second = run()
    assert second.returncode == 0 and "--alpha-two" in second.stdout and "--alpha-one" not in second.stdout


def test_the_terminal_width_is_in_the_key_without_columns(monkeypatch):
    """argparse wraps help at the terminal's width, which $COLUMNS only overrides."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(os, "get_terminal_size", lambda *fd: os.terminal_size((100, 40)))
    narrow = help_key.key("shard-train", ["--help"])
    monkeypatch.setattr(os, "get_terminal_size", lambda *fd: os.terminal_size((160, 40)))
    assert help_key.key("shard-train", ["--help"]) != narrow


def test_a_symlinked_plugin_subpackage_is_keyed_by_content(tmp_path):
    plugin, elsewhere = tmp_path / "plug", tmp_path / "elsewhere" / "models"
    plugin.mkdir()
    elsewhere.mkdir(parents=True)
    (plugin / "__init__.py").write_text("from . import models\n")
    (elsewhere / "__init__.py").write_text("WIDTH = 16\n")
    (plugin / "models").symlink_to(elsewhere, target_is_directory=True)
    before = help_key.key("shard-train", ["--user-dir", str(plugin), "--help"])
    same_size_edit(elsewhere / "__init__.py", "16", "32")
    assert help_key.key("shard-train", ["--user-dir", str(plugin), "--help"]) != before


def test_the_cache_lives_under_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv(help_cache.ENV_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert help_cache.cache_dir() == str(tmp_path / "xdg" / "shardtrain")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert help_cache.cache_dir() == str(tmp_path / "home" / ".cache" / "shardtrain")
    monkeypatch.setenv(help_cache.ENV_DIR, str(tmp_path / "mine"))
    assert help_cache.cache_dir() == str(tmp_path / "mine")


def test_a_fifo_or_a_device_in_the_user_dir_is_keyed_without_reading_it(tmp_path):
    import threading

    plugin = tmp_path / "plug"
    plugin.mkdir()
    os.mkfifo(plugin / "notes.py")  # a read waits for a writer forever
    (plugin / "zero.py").symlink_to("/dev/zero")  # a read never ends
    keys = []
    worker = threading.Thread(target=lambda: keys.append(help_key.key("shard-train", ["--user-dir", str(plugin)])),
                              daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert len(keys) == 1 and len(keys[0]) == 32, "the key still reads after 30 s"


def test_the_torch_version_and_the_command_stay_in_a_user_dirs_key(tmp_path, monkeypatch):
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    argv = ["--user-dir", str(plugin), "--help"]
    assert help_key.key("shard-train", argv) != help_key.key("shard-validate", argv)
    before = help_key.key("shard-train", argv)
    versions = {"torch": "2.99.0"}

    def version(distribution):
        if distribution not in versions:
            raise help_key.importlib.metadata.PackageNotFoundError(distribution)
        return versions[distribution]

    monkeypatch.setattr(help_key.importlib.metadata, "version", version)
    with_torch = help_key.key("shard-train", argv)
    versions["torch"] = "2.99.1"
    assert len({before, with_torch, help_key.key("shard-train", argv)}) == 3


def test_user_dir_forms_at_the_edges():
    assert help_key.user_dirs(["--help", "--user-dir"]) == []  # no path after it: argparse's error, not ours
    assert help_key.user_dirs(["--user-dir=/plugins/a=b"]) == ["/plugins/a=b"]  # only the first '=' splits


def test_a_symlink_loop_is_walked_once_and_the_walk_goes_on(tmp_path):
    root = tmp_path / "plugin"
    (root / "a").mkdir(parents=True)
    (root / "z").mkdir()
    os.symlink(root, root / "a" / "loop")  # back to the top: followed once, then not again
    (root / "a" / "one.py").write_text("")
    (root / "z" / "two.py").write_text("")
    assert list(help_key._walk(str(root))) == [str(root / "a" / "one.py"), str(root / "z" / "two.py")]


def test_a_file_of_exactly_the_limit_is_hashed(tmp_path, monkeypatch):
    monkeypatch.setattr(help_key, "HASHED_UP_TO", 4)
    (tmp_path / "four.py").write_bytes(b"abcd")
    assert help_key._describe(str(tmp_path / "four.py")) == hashlib.sha256(b"abcd").hexdigest()
    (tmp_path / "five.py").write_bytes(b"abcde")
    assert help_key._describe(str(tmp_path / "five.py")).startswith("size 5 mtime ")
