"""Count the lines of the five experiment scripts as benchmarks/README.md does:
non-blank lines that are not comment-only and not part of a docstring; imports count.

    python benchmarks/economy/count.py
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = ("e1_digits.py", "e2_unfreeze.py", "e3_gan.py", "e4_throughput.py", "e5_resume.py")


def docstring_lines(tree: ast.AST) -> set[int]:
    """The lines of the module's, classes' and functions' docstrings."""
    found: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            found.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return found


def code_lines(path: Path) -> int:
    """Lines holding code: not blank, not only a comment, not in a docstring."""
    source = path.read_text(encoding="utf-8")
    skipped = docstring_lines(ast.parse(source))
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                          tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        code.update(range(token.start[0], token.end[0] + 1))
    return len(code - skipped)


def main() -> int:
    counts = {name: code_lines(HERE / name) for name in SCRIPTS}
    for name, count in counts.items():
        print(f"{name:<18} {count:>4}")
    print(f"{'total':<18} {sum(counts.values()):>4}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
