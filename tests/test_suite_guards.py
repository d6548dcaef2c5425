"""The suite's own guards: a skip for want of a capability CI requires fails (tests/required.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT


def test_a_skip_for_a_required_capability_fails_and_any_other_stays_a_skip(tmp_path):
    (tmp_path / "test_probe.py").write_text(
        "import pytest\nfrom tests.required import needs\n\n"
        "def test_lacks_the_cluster():\n    pytest.skip(needs('cluster', 'no unshare here'))\n\n"
        "@pytest.mark.skipif(True, reason=needs('port', 'no port here'))\ndef test_lacks_the_port():\n    pass\n\n"
        "def test_skips_for_another_reason():\n    pytest.skip('no C compiler')\n")

    def run(required: str) -> tuple[int, str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GR00T_TEST_REQUIRE": required}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.required", "-p", "no:cacheprovider",
                               "-o", "addopts=", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, env=env)
        return proc.returncode, (proc.stdout.strip().splitlines() or [proc.stderr])[-1]

    code, said = run("")
    assert code == 0 and "3 skipped" in said, said
    code, said = run("cluster,port,root")  # (a skipif mark fails in setup: pytest counts that an error)
    assert code == 1 and "1 failed" in said and "1 error" in said and "1 skipped" in said, said
    code, said = run("port")
    assert code == 1 and "1 error" in said and "2 skipped" in said and "failed" not in said, said
    code, said = run("gpu")
    assert code != 0 and "GR00T_TEST_REQUIRE names gpu" in said, said


def test_the_files_go_to_the_workers_longest_first_by_a_table_that_names_real_files(request):
    """tests/file_order.py: every file its table times is a test file of this suite (a renamed one would silently go
    last), and the session's own collection runs the files in the table's order, longest first, each file whole."""
    import json

    from tests.file_order import TABLE

    seconds = json.loads(TABLE.read_text())["seconds"]
    assert {name for name in seconds} <= {p.name for p in (ROOT / "tests").glob("test_*.py")}
    files = [item.path.name for item in request.session.items]
    runs = [name for i, name in enumerate(files) if i == 0 or files[i - 1] != name]
    assert len(runs) == len(set(runs))  # each file's tests together
    assert [seconds.get(n, 0.0) for n in runs] == sorted((seconds.get(n, 0.0) for n in runs), reverse=True)
