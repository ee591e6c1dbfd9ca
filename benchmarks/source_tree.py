"""Import flashcheck from a source checkout without installing it.

The installed package maps folders to subpackages (pyproject's package-dir: api/ is
``flashcheck``, harness/ is ``flashcheck.harness``, ...). A machine that cannot ``pip install``
the checkout (the GPU machine, a mutated copy of the tree) gets the same layout from symlinks:

    python benchmarks/source_tree.py /tmp/fc     # then: PYTHONPATH=/tmp/fc python ...
    PYTHONPATH=/tmp/fc python -m pytest -p flashcheck.properties.plugin properties

(``-p`` loads the pytest plugin, which an installed copy registers through its entry point.)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"harness": "harness", "kernels": "kernels", "properties": "properties"}


def stage(root: Path, dest: Path) -> Path:
    """Make ``dest/flashcheck`` a symlinked image of the package rooted at ``root``; returns
    ``dest`` (the folder to put on ``PYTHONPATH``)."""
    pkg = dest / "flashcheck"
    pkg.mkdir(parents=True, exist_ok=True)
    links = {p.name: p for p in (root / "api").glob("*.py")}
    links.update({name: root / folder for name, folder in FOLDERS.items()})
    for name, target in links.items():
        link = pkg / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target.resolve())
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python benchmarks/source_tree.py DEST")
    print(stage(ROOT, Path(sys.argv[1]).resolve()))
