"""The code keeps the layering docs/DESIGN.md writes down: no module imports from a layer above its
own (imports at any depth, read with ast), and every package is in the map."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layers() -> dict[str, int]:
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S).group(1)
    rank = {}
    for depth, line in enumerate(reversed([l for l in block.splitlines() if l.strip()])):
        for name in line.split(","):
            rank[name.strip()] = depth
    return rank


def unit(path: Path) -> str:
    rel = path.relative_to(ROOT / "ringps").with_suffix("")
    return rel.parts[0]


def imported_units(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ringps":
            parts = node.module.split(".")
            out |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("ringps.")}
    return out


def test_imports_point_down():
    rank = layers()
    upward = []
    for f in sorted((ROOT / "ringps").rglob("*.py")):
        me = unit(f)
        if me in ("__init__", "__main__"):
            continue
        assert me in rank, f"{me} (ringps/{me}) is not in docs/DESIGN.md's layers block"
        for other in imported_units(ast.parse(f.read_text())) - {me}:
            assert other in rank, f"{f}: imports ringps.{other}, which is not in the layers block"
            if rank[other] > rank[me]:
                upward.append(f"{f.relative_to(ROOT)} ({me}) imports {other}")
    assert not upward, "imports from a layer above:\n" + "\n".join(upward)


def test_no_reference_to_a_design_document_outside_the_repository():
    for f in list((ROOT / "ringps").rglob("*.py")) + [ROOT / "README.md"]:
        for m in re.finditer(r"(\S{0,5})DESIGN\.md", f.read_text()):
            assert m.group(1).endswith("docs/"), f"{f}: '{m.group(0)}' does not point to docs/DESIGN.md"
