"""Share of prose in the source: (comment-only lines + docstring lines) / non-blank lines of the .py files.

A docstring is the string literal that opens a module, class or function; blank lines count nowhere.
Trailing comments after code count as code. Usage: ``python scripts/prose_share.py [root]`` (default ``src/rlplane``).
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path


def prose_lines(source: str) -> tuple[int, int, int]:
    """(comment-only lines, docstring lines, non-blank lines) of one file."""
    lines = source.splitlines()
    comments = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1].strip().startswith("#"):
            comments.add(tok.start[0])
    docs = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
                docs.update(range(first.lineno, first.end_lineno + 1))
    docs = {n for n in docs - comments if lines[n - 1].strip()}
    return len(comments), len(docs), sum(1 for line in lines if line.strip())


def main(root: str = "src/rlplane") -> None:
    comments = docs = total = 0
    for path in sorted(Path(root).rglob("*.py")):
        c, d, t = prose_lines(path.read_text())
        comments, docs, total = comments + c, docs + d, total + t
    share = (comments + docs) / max(total, 1)
    print(f"{root}: {comments} comment + {docs} docstring lines = {comments + docs} of {total} non-blank lines: "
          f"{share:.1%}")


if __name__ == "__main__":
    main(*sys.argv[1:])
