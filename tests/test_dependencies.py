"""What a new machine installs is what the code imports: deptry over the whole tree (the lab, its
pages, tests, notebooks and benchmarks) against pyproject.toml, the one place dependencies are
declared; and the check is not vacuous: an undeclared import, a test tool imported by the lab and a
declared package nothing imports, each planted in a copy of the project, fail it by name."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # deptry runs as its own process
# The lab alone: its code may not import what only the test extra brings.
PRODUCT = ["--optional-dependencies-dev-groups", "test", "--extend-exclude", "tests|benchmarks|notebooks"]


def deptry(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deptry", ".", "--no-ansi", *args], cwd=root,
                          capture_output=True, text=True, timeout=120)


def test_every_import_is_declared_and_every_declared_package_is_imported():
    done = deptry(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_lab_imports_nothing_that_only_the_tests_install():
    done = deptry(ROOT, *PRODUCT)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def copy(tmp_path) -> Path:
    """The project's sources and pyproject.toml, without the run folders and caches."""
    dest = tmp_path / "commlab"
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        ".git", ".venv", "runs", "test-artifacts", "__pycache__", "*.egg-info", "build"))
    return dest


@pytest.mark.parametrize("plant, args, rule, named", [
    (("commlab/tune/pareto.py", "import not_a_declared_package\n"), (), "DEP001", "not_a_declared_package"),
    (("tests/test_config.py", "import not_a_declared_package\n"), (), "DEP001", "not_a_declared_package"),
    (("commlab/commands/__init__.py", "import pytest\n"), PRODUCT, "DEP004", "pytest"),
    (("pyproject.toml", None), (), "DEP002", "six"),
])
def test_a_planted_fault_fails_the_check_by_name(copy, plant, args, rule, named):
    path, line = plant
    target = copy / path
    assert deptry(copy, *args).returncode == 0  # the copy as it is passes
    if line is None:  # a declared package that nothing imports
        text = target.read_text()
        target.write_text(text.replace('dependencies = ["torch",', 'dependencies = ["six", "torch",', 1))
    else:
        target.write_text(target.read_text() + line)
    done = deptry(copy, *args)
    said = done.stdout + done.stderr  # deptry reports on stderr
    assert done.returncode != 0 and rule in said and f"'{named}'" in said, said
