"""Imports point downstream (STYLE principle 3) and `import detrkit` stays light."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "src" / "detrkit"
# data flows one way; a package may import the foundation and the packages before it
# (key_points and predictor: predict()'s outputs and loop, shared by the model and exported files)
ORDER = ["datasets", "models", "losses", "training", "evaluation", "analysis", "checkpoints", "key_points", "predictor", "export"]
FOUNDATION = {"config", "structures", "ops", "version"}
WIRING = {"detr", "cli", "demo", "variants", "__init__"}


def detrkit_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("detrkit"):
            parts = node.module.split(".")
            found.add(parts[1] if len(parts) > 1 else "__init__")
        elif isinstance(node, ast.Import):
            # `import detrkit` reaches the package root (the wiring), `import detrkit.x` the package x
            found |= {(a.name.split(".") + ["__init__"])[1] for a in node.names if a.name.split(".")[0] == "detrkit"}
    return found


def test_packages_import_only_upstream():
    problems = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).parts
        owner = relative[0].removesuffix(".py")
        if owner in WIRING:
            continue
        allowed = set(FOUNDATION) | {owner}
        if owner in ORDER:
            allowed |= set(ORDER[: ORDER.index(owner)])
        elif owner in FOUNDATION:
            allowed = FOUNDATION - {"ops"} if owner != "ops" else {"ops"}
        problems += [f"{path.relative_to(PACKAGE)} imports detrkit.{m}" for m in detrkit_imports(path) - allowed]
    assert not problems, problems


def test_import_does_not_load_lightning_or_supervision():
    code = "import sys, detrkit; print(any(m.split('.')[0] in ('lightning', 'pytorch_lightning', 'supervision') for m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_plain_package_imports_are_seen(tmp_path):
    """`import detrkit` below the wiring layer is an upward import too, not only `from detrkit...`."""
    source = tmp_path / "module.py"
    source.write_text("import detrkit\nimport detrkit.models.build\nimport os\nfrom detrkit.ops import boxes\n")
    assert detrkit_imports(source) == {"__init__", "models", "ops"}


def test_version_has_one_home():
    import detrkit
    from detrkit.version import __version__

    from importlib.metadata import version

    assert detrkit.__version__ is __version__
    assert version("detrkit") == __version__  # pyproject reads it from detrkit.version
