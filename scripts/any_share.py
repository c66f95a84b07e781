"""Share of public functions in a package whose signature mentions ``Any`` (issue 38's typing measure).

Public: a function or method whose name does not start with ``_`` (dunders such as ``__init__`` and
``__call__`` count as public, they are a class's interface), defined in a module whose path has no part
starting with ``_`` other than ``__init__.py``/``__main__.py``. A signature mentions ``Any`` when a parameter's or
the return annotation contains the name ``Any`` (``Any``, ``typing.Any``, ``dict[str, Any]``, ...).

Usage: ``python scripts/any_share.py [PACKAGE_DIR ...]`` (default ``mas_train``); ``--list`` prints the
functions counted as having ``Any``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _mentions_any(node: ast.expr | None) -> bool:
    if node is None:
        return False
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id == "Any":
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "Any":
            return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):  # string annotation
            try:
                if _mentions_any(ast.parse(sub.value, mode="eval").body):
                    return True
            except SyntaxError:
                pass
    return False


def _is_public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Module-level functions and methods of module-level (and nested) public classes."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _is_public(node.name):
                found.append((prefix + node.name, node))
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return found


def count(root: Path) -> tuple[int, list[str]]:
    """(number of public functions, names of those whose signature mentions ``Any``) under ``root``."""
    total = 0
    with_any: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        if any(p.startswith("_") and p not in ("__init__.py", "__main__.py") for p in rel.parts):
            continue
        for name, fn in _functions(ast.parse(path.read_text(), str(path))):
            total += 1
            a = fn.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p)]
            if any(_mentions_any(p.annotation) for p in params) or _mentions_any(fn.returns):
                with_any.append(f"{rel}:{fn.lineno} {name}")
    return total, with_any


def main(argv: list[str]) -> int:
    show = "--list" in argv
    roots = [a for a in argv if a != "--list"] or ["mas_train"]
    for r in roots:
        total, with_any = count(Path(r))
        if show:
            print("\n".join(with_any))
        print(
            f"{r}: {len(with_any)} of {total} public functions have Any in their signature "
            f"({100 * len(with_any) / max(total, 1):.1f} %)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
