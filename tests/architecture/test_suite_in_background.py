"""The suite started the way a background job is (SIGINT ignored, as `cmd &` and nohup leave it) still tests
Ctrl-C: tests/conftest.py gives the processes it starts the default SIGINT back."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # starts pytest in a process of its own

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_suite_started_with_sigint_ignored_still_delivers_ctrl_c(tmp_path):
    (tmp_path / "conftest.py").write_text(open(os.path.join(TESTS, "conftest.py")).read())
    (tmp_path / "tier_guard.py").write_text(open(os.path.join(TESTS, "tier_guard.py")).read())
    (tmp_path / "test_ctrl_c_child.py").write_text(textwrap.dedent('''
        import signal, subprocess, sys
        import pytest

        @pytest.mark.slow
        def test_child_is_interrupted():
            child = subprocess.run([sys.executable, "-c", "import os, signal, time\\n"
                                    "os.kill(os.getpid(), signal.SIGINT)\\ntime.sleep(30)"], capture_output=True)
            assert child.returncode == -signal.SIGINT and b"KeyboardInterrupt" in child.stderr, child

        @pytest.mark.slow
        def test_this_process_is_interrupted():
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
    '''))
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert ran.returncode == 0 and "2 passed" in ran.stdout, ran.stdout + ran.stderr
