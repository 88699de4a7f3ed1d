"""The layers of docs/architecture.md hold (the import-linter contracts in pyproject.toml), no module
closes an import cycle, and ruff's agreed rules pass: checked here, so that the README's one test
command checks them."""
from __future__ import annotations

import os

import grimp
import pytest
from importlinter import cli as importlinter_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_import_contracts_hold(capsys):
    code = importlinter_cli.lint_imports(config_filename=os.path.join(ROOT, "pyproject.toml"),
                                         no_cache=True, no_logo=True)
    assert code == 0, capsys.readouterr().out


def test_a_broken_layer_is_caught(tmp_path, monkeypatch):
    """The contract is not vacuous: a package that imports upward fails it."""
    pkg = tmp_path / "commlab_probe"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "config.py").write_text("from commlab_probe.engine import launch\n")
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "engine" / "launch.py").write_text("from commlab_probe import config\n")
    cfg = tmp_path / "probe.toml"
    cfg.write_text('[tool.importlinter]\nroot_package = "commlab_probe"\n'
                   '[[tool.importlinter.contracts]]\nname = "layers"\ntype = "layers"\n'
                   'layers = ["commlab_probe.engine", "commlab_probe.config"]\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert importlinter_cli.lint_imports(config_filename=str(cfg), no_cache=True, no_logo=True) == 1


def test_no_module_imports_itself_round_a_cycle():
    """No cycles at all, inside a layer too (imports inside functions count)."""
    graph = grimp.build_graph("commlab")
    cycles = [(a, b) for a in sorted(graph.modules) for b in sorted(graph.find_modules_directly_imported_by(a))
              if graph.chain_exists(importer=b, imported=a)]
    assert not cycles, f"imports that close a cycle: {cycles}"


@pytest.mark.slow  # ruff runs as its own process
def test_ruff_finds_nothing():
    """The agreed rule set (ruff.toml) over the whole tree, notebooks included."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
