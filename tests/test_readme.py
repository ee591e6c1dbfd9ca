"""The README's "test your kernel" example runs as written, in a user's folder, on a correct
kernel (a documentation example that fails a correct kernel is a bug: it once did, on
Hypothesis' default deadline)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_readme_pytest_example_passes_on_a_correct_kernel(tmp_path):
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    (example,) = [b for b in blocks if "attention_cases(" in b and "assert_attention" in b]
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copy(ROOT / "tests" / "user" / "user_kernels.py", pkg / "user_kernels.py")
    (pkg / "attn.py").write_text("from mypkg.user_kernels import textbook as forward\n")
    (tmp_path / "test_example.py").write_text(example)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHCHECK_", "HYPOTHESIS_"))}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_example.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout
