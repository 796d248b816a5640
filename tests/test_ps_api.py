"""The parameter server in a user's own loop: the README's example, verbatim, under torchrun."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_readme_shows_the_example_verbatim():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### The parameter server in your own loop"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert code == (ROOT / "examples" / "ps_loop.py").read_text()
    assert len(code.splitlines()) <= 25
    ast.parse(code)


@pytest.mark.slow
def test_the_example_trains_under_torchrun():
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                        str(ROOT / "examples" / "ps_loop.py")], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    acc = [float(a) for a in re.findall(r"accuracy ([0-9.]+)", r.stdout)]
    assert len(acc) == 2 and min(acc) >= 0.8, r.stdout
    stats = ast.literal_eval(next(l for l in r.stdout.splitlines() if l.startswith("{'server'")))
    assert stats["pushes_applied"] + stats["pushes_dropped"] == 400 and stats["max_applied_staleness"] <= 2
