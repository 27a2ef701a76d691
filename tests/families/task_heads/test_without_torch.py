"""The tests not marked `torch` run, and pass, where torch cannot be imported: the family plans
and finishes with the tokenizer alone, and so do its tests."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from helpers import REPO

HERE = Path(__file__).resolve().parent

# Runs pytest in a process where `import torch` fails, as it does where torch is not installed
# (and importlib.util.find_spec("torch") answers None, as it does there too).
_BLOCKED = """
import importlib.util, sys
sys.modules["torch"] = None
assert importlib.util.find_spec("torch") is None
try:
    import torch
except ImportError:
    pass
else:
    raise SystemExit("torch is still importable")
import pytest
code = pytest.main(sys.argv[1:])
assert "torch" not in sys.modules or sys.modules["torch"] is None, "a test imported torch"
raise SystemExit(code)
"""


def test_tokenizer_only_tests_pass_without_torch(tmp_path: Path) -> None:
    args = [
        str(HERE),
        f"--ignore={Path(__file__).resolve()}",
        "-m",
        "not torch",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--basetemp={tmp_path / 'pytest'}",
    ]
    result = subprocess.run(
        [sys.executable, "-c", _BLOCKED, *args], cwd=REPO, capture_output=True, text=True, timeout=280
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # pytest's own closing line, from its stdout: a plugin's warning on stderr (pytest-benchmark's
    # under xdist, whose worker variables this process inherits) may come after it.
    summary = result.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed is not None and int(passed.group(1)) >= 15, summary
    assert "skipped" not in summary and "failed" not in summary and "error" not in summary, summary
