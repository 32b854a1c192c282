"""Imports point downstream (STYLE principle 3) and `import detrkit` stays light."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "src" / "detrkit"
# data flows one way; a package may import the foundation and the packages before it
ORDER = ["datasets", "models", "losses", "training", "evaluation", "checkpoints"]
FOUNDATION = {"config", "structures", "ops"}
WIRING = {"detr", "cli", "demo", "variants", "__init__"}


def detrkit_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("detrkit"):
            parts = node.module.split(".")
            found.add(parts[1] if len(parts) > 1 else "__init__")
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("detrkit.")}
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
            allowed = {"config", "structures", "ops"} if owner != "ops" else {"ops"}
        problems += [f"{path.relative_to(PACKAGE)} imports detrkit.{m}" for m in detrkit_imports(path) - allowed]
    assert not problems, problems


def test_import_does_not_load_lightning_or_supervision():
    code = "import sys, detrkit; print(any(m.split('.')[0] in ('lightning', 'pytorch_lightning', 'supervision') for m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
