"""The module map of ``docs/architecture.md`` is made from the tree: one row per package (a
folder with an ``__init__.py``) with the first sentence of its docstring and its modules. The
test fails when the two differ; ``python tests/test_architecture_map.py`` prints the map to
paste between the markers."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- module map: made by `python tests/test_architecture_map.py` -->"
END = "<!-- end of the module map -->"
PACKAGES = ("spark_ckpt", "datasources")

_ROLE = re.compile(r":(?:mod|class|func|meth|data|attr):`~?([^`<]*?)(?: <[^>]*>)?`")


def _first_sentence(docstring: str) -> str:
    """The first sentence of a docstring's first paragraph, roles reduced to their names."""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    text = _ROLE.sub(lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", paragraph)
    text = text.replace("``", "`")
    sentence = re.match(r"(.+?\.)(?:\s|$)", text)
    text = sentence.group(1) if sentence else text
    head = re.match(r"(.{25,}?):\s", text)  # a long sentence: what comes before its colon
    return (head.group(1) if head else text).rstrip(":.") + "."


def module_map() -> str:
    """The map: a Markdown table, packages in path order."""
    rows = ["| package | what it is | modules |", "|---|---|---|"]
    for top in PACKAGES:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            folder = init.parent
            if "__pycache__" in folder.parts:
                continue
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            modules = sorted(p.stem for p in folder.glob("*.py") if p.name != "__init__.py")
            name = ".".join(folder.relative_to(ROOT).parts)
            listed = ", ".join(f"`{m}`" for m in modules) or "—"
            rows.append(f"| `{name}` | {_first_sentence(doc)} | {listed} |")
    return "\n".join(rows)


def documented_map() -> str:
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip()


def test_the_module_map_is_the_tree() -> None:
    assert documented_map() == module_map(), (
        "docs/architecture.md's module map differs from the tree: "
        "run `python tests/test_architecture_map.py` and paste its output between the markers"
    )


def test_every_package_says_what_it_is() -> None:
    for top in PACKAGES:
        for init in (ROOT / top).rglob("__init__.py"):
            doc = ast.get_docstring(ast.parse(init.read_text()))
            assert doc, f"{init.relative_to(ROOT)} has no docstring"


if __name__ == "__main__":
    sys.stdout.write(module_map() + "\n")
