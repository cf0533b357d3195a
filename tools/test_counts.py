"""How much the test suite checks, so a change that speeds the suite up can show it weakened nothing: the
``assert`` statements (counted on the AST, so comments and strings do not count) and the ``pytest.raises`` uses
in the test files, and the test cases pytest collects (every parametrised case counts once).

Usage: python tools/test_counts.py [TESTS_DIR] [--no-collect]
(--no-collect skips the pytest run that counts the collected cases.)
"""
import ast
import subprocess
import sys
from pathlib import Path


def is_raises(node) -> bool:
    """``pytest.raises`` (called, or used bare as in ``with raises(...)`` after ``from pytest import raises``)."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr == "raises" and isinstance(node.value, ast.Name) and node.value.id == "pytest"
    return isinstance(node, ast.Name) and node.id == "raises"


def count(tests: Path) -> tuple[int, int, int]:
    """(files, assert statements, pytest.raises calls) in every ``*.py`` under ``tests``."""
    files = asserts = raises = 0
    for f in sorted(tests.rglob("*.py")):
        files += 1
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            asserts += isinstance(node, ast.Assert)
            raises += isinstance(node, ast.Call) and is_raises(node)
    return files, asserts, raises


def collected(tests: Path) -> str:
    """The last line of ``pytest --collect-only -q -m 'not gpu'``: how many cases the suite runs."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not gpu", str(tests)], capture_output=True, text=True, cwd=tests.parent)
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    return lines[-1] if lines else out.stderr.strip()


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    tests = Path(args[0] if args else Path(__file__).resolve().parents[1] / "tests").resolve()
    files, asserts, raises = count(tests)
    print(f"files {files}  assert {asserts}  pytest.raises {raises}  checks {asserts + raises}")
    if "--no-collect" not in sys.argv:
        print(f"collected: {collected(tests)}")


if __name__ == "__main__":
    main()
