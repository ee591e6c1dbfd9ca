"""The wheel's package list, read from the folders, so a new subpackage cannot miss the wheel.

Everything else is in pyproject.toml; its ``package-dir`` maps each top-level folder to a
subpackage of the one import name, ``flashcheck``.
"""

from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
FOLDERS = {
    "flashcheck": "api",
    "flashcheck.harness": "harness",
    "flashcheck.kernels": "kernels",
    "flashcheck.properties": "properties",
}


def packages() -> list[str]:
    """Every folder with an ``__init__.py`` under the mapped folders, as a package name."""
    out = []
    for name, folder in FOLDERS.items():
        for init in sorted((HERE / folder).rglob("__init__.py")):
            out.append(".".join([name, *init.parent.relative_to(HERE / folder).parts]))
    return out


setup(packages=packages())
