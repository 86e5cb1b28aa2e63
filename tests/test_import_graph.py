"""The import graph of the specdash package, read from the source with `ast` (nothing is
imported): every import runs down the layer table below, which docs/ARCHITECTURE.md
states too, or stays inside its layer; and no import cycle exists but one that only the
type checker sees.

What counts as an import: `import` and `from ... import` anywhere, at module level or
inside a function (a lazy import is a dependency all the same, only a later one), and
`importlib.import_module` with a literal name. Importing `a.b.c` also runs the packages
`a.b` and `a` (their `__init__`), so those count too, unless the importer is inside them.
Imports under `if TYPE_CHECKING:` never run: they may close a cycle, but they must still
run down the layers (a type from a higher layer ties the lower one to it as well).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specdash"
DOC = ROOT / "docs" / "ARCHITECTURE.md"

# The layer table, bottom first: each layer's modules (paths under specdash/; a folder
# is everything in it) and the layers it may import besides its own. The same table is
# in docs/ARCHITECTURE.md ("Layers, and what each may import"); a test below holds the
# two together. EARLIER: every layer listed before this one.
EARLIER = "all earlier rows"
LAYERS: dict[str, tuple[tuple[str, ...], tuple[str, ...] | str]] = {
    "base": (("__init__.py", "contract/__init__.py", "contract/errors.py", "contract/paths.py",
              "contract/limits.py", "contract/hosts.py", "contract/names.py", "contract/faults.py"), ()),
    "machine": (("telemetry/",), ("base",)),
    "contract": (("contract/events.py", "contract/vocabulary.py"), ("machine", "base")),
    "models": (("models/",), ("base",)),
    "monitor": (("monitor/",), ("contract", "base")),
    "engine": (("engine/",), ("models", "contract", "machine", "base")),
    "costs": (("costs/",), ("engine", "machine", "base")),
    "records": (("records/",), ("engine", "models", "contract", "machine", "base")),
    "sources": (("sources/",), ("records", "costs", "engine", "monitor", "models", "contract", "base")),
    "tuning": (("tuning/",), ("sources", "records", "costs", "engine", "monitor", "models", "contract", "machine",
                              "base")),
    "config": (("config.py",), ("engine", "monitor", "contract", "base")),
    "server": (("serve/",), ("config", "sources", "engine", "monitor", "contract", "base")),
    "UI": (("tui/",), ("config", "tuning", "sources", "records", "engine", "monitor", "models", "contract",
                       "machine", "base")),
    "web": (("web/",), ("base",)),
    "CLI": (("commands/",), EARLIER),
    "entry": (("cli.py", "__main__.py", "web_tab.py"), EARLIER),
}


def may_import() -> dict[str, set[str]]:
    names = list(LAYERS)
    return {layer: set(names[:i]) if allowed == EARLIER else set(allowed)
            for i, (layer, (_, allowed)) in enumerate(LAYERS.items())}


@dataclass(frozen=True, slots=True)
class Import:
    importer: str  # dotted module name
    target: str
    line: int
    type_only: bool  # under `if TYPE_CHECKING:`
    implied: bool = False  # a package run because a module inside it was imported

    def where(self) -> str:
        return f"{module_file(self.importer)}:{self.line}"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def module_file(name: str) -> str:
    return str(modules()[name].relative_to(ROOT))


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str, path: Path, known: dict[str, Path]) -> list[Import]:
    """What `name` imports of specdash, with the packages each import runs."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def add(target: str, line: int, type_only: bool) -> None:
        if target != "specdash" and not target.startswith("specdash."):
            return
        assert target in known, f"{path.relative_to(ROOT)}:{line} imports {target}, which is no module of specdash"
        found.append(Import(name, target, line, type_only))
        parts = target.split(".")
        for n in range(1, len(parts)):
            parent = ".".join(parts[:n])
            if not (name == parent or name.startswith(parent + ".")):
                found.append(Import(name, parent, line, type_only, implied=True))

    def visit(node: ast.AST, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child.test):
                for stmt in child.body:
                    visit_one(stmt, True)
                for stmt in child.orelse:
                    visit_one(stmt, type_only)
            else:
                visit_one(child, type_only)

    def visit_one(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno, type_only)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                add(sub if sub in known else source, node.lineno, type_only)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            add(node.args[0].value, node.lineno, type_only)
            visit(node, type_only)
        else:
            visit(node, type_only)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), False)
    return found


def graph() -> list[Import]:
    known = modules()
    return [imp for name, path in known.items() for imp in imports_of(name, path, known)]


def layer_of(name: str) -> str:
    """The layer holding module `name`: the longest entry of the table that covers it."""
    rel = name.split(".")[1:]
    best, best_len = "", -1
    for layer, (entries, _) in LAYERS.items():
        for entry in entries:
            parts = entry.removesuffix("/").removesuffix(".py").split("/")
            if entry.endswith("/"):
                covers = rel[: len(parts)] == parts
            elif parts[-1] == "__init__":
                covers = rel == parts[:-1]  # the package itself
            else:
                covers = rel == parts
            if covers and len(parts) > best_len:
                best, best_len = layer, len(parts)
    return best


def cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's)."""
    succ: dict[str, set[str]] = defaultdict(set)
    for imp in edges:
        succ[imp.importer].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(succ[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in succ[v]:
                out.append(sorted(component))

    for v in sorted({imp.importer for imp in edges} | {imp.target for imp in edges}):
        if v not in index:
            connect(v)
    return out


def path_around(component: list[str], edges: list[Import]) -> list[Import]:
    """One cycle through the component's first module, as the imports that make it."""
    inside = set(component)
    by_importer: dict[str, list[Import]] = defaultdict(list)
    for imp in edges:
        if imp.importer in inside and imp.target in inside:
            by_importer[imp.importer].append(imp)
    start = component[0]
    came: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for imp in by_importer[v]:
                if imp.target == start:
                    chain = [imp]
                    while chain[0].importer != start:
                        chain.insert(0, came[chain[0].importer])
                    return chain
                if imp.target not in came:
                    came[imp.target] = imp
                    nxt.append(imp.target)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")


# --- the tests -----------------------------------------------------------------------


def test_every_module_is_in_exactly_one_layer_of_the_table():
    entries = [(layer, entry) for layer, (names, _) in LAYERS.items() for entry in names]
    for layer, entry in entries:
        assert (PACKAGE / entry).exists(), f"layer {layer}: specdash/{entry} does not exist"
    assert len({entry for _, entry in entries}) == len(entries), "an entry is in two layers"
    unplaced = [module_file(name) for name in modules() if not layer_of(name)]
    assert not unplaced, f"modules in no layer: add them to LAYERS and to docs/ARCHITECTURE.md: {unplaced}"


def test_the_layers_themselves_form_no_cycle():
    allowed = may_import()
    order = list(LAYERS)
    for layer, below in allowed.items():
        assert all(order.index(b) < order.index(layer) for b in below), \
            f"{layer} may import {sorted(below)}: only earlier rows of the table"


def test_no_import_runs_up_a_layer():
    allowed = may_import()
    up = []
    for imp in graph():
        mine, theirs = layer_of(imp.importer), layer_of(imp.target)
        if mine != theirs and theirs not in allowed[mine]:
            how = " (type checking only)" if imp.type_only else " (its package)" if imp.implied else ""
            up.append(f"{imp.where()} {imp.importer} imports {imp.target}{how}: "
                      f"{mine} may import {', '.join(sorted(allowed[mine])) or 'nothing'}, not {theirs}")
    assert not up, "imports that run up a layer:\n" + "\n".join(up)


def test_no_import_cycle_but_a_type_checking_one():
    edges = [imp for imp in graph() if not imp.type_only]
    found = []
    for component in cycles(edges):
        chain = path_around(component, edges)
        found.append(" -> ".join([chain[0].importer] + [f"{imp.target} ({imp.where()})" for imp in chain]))
    assert not found, "import cycles:\n" + "\n".join(found)


def test_the_checks_see_a_lazy_import_a_cycle_and_a_type_checking_exemption(tmp_path):
    """The reader itself: a function-level import is an edge, TYPE_CHECKING marks one, and
    a cycle is found. (Guards against a checker that passes because it sees nothing.)"""
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\n"
                   "if TYPE_CHECKING:\n    from specdash.engine.llm import LLM\n"
                   "def f():\n    from specdash.contract import events\n    import specdash.engine.settings\n",
                   encoding="utf-8")
    known = modules()
    found = imports_of("specdash.tui.m", src, known)
    assert {(i.target, i.type_only, i.implied) for i in found} == {
        ("specdash.engine.llm", True, False), ("specdash.engine", True, True),
        ("specdash.contract.events", False, False), ("specdash.contract", False, True),
        ("specdash.engine.settings", False, False), ("specdash.engine", False, True),
    }
    a_b = [Import("specdash.a", "specdash.b", 1, False), Import("specdash.b", "specdash.a", 2, False)]
    assert cycles(a_b) == [["specdash.a", "specdash.b"]]
    assert [i.target for i in path_around(["specdash.a", "specdash.b"], a_b)] == ["specdash.b", "specdash.a"]


def _doc_table() -> dict[str, tuple[set[str], set[str]]]:
    """The layer table as docs/ARCHITECTURE.md writes it: layer -> (entries, may import)."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| Layer")]
    out = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        layer, mods, allowed = cells[0], cells[1], cells[2]
        entries = {m for m in re.findall(r"`([^`]+)`", mods) if m.endswith((".py", "/"))}
        names = list(LAYERS)
        if EARLIER in allowed:
            may = set(names[: names.index(layer)]) if layer in names else {EARLIER}
        else:
            # Notes in parentheses say why; the layers are the words outside them.
            may = {w for w in re.findall(r"[A-Za-z]+", re.sub(r"\([^)]*\)", "", allowed)) if w in LAYERS}
        out[layer] = (entries, may)
    return out


def test_the_architecture_doc_states_the_same_table():
    doc = _doc_table()
    assert list(doc) == list(LAYERS), f"the doc's layers, in order: {list(doc)}"
    allowed = may_import()
    for layer, (entries, _) in LAYERS.items():
        doc_entries, doc_may = doc[layer]
        assert doc_entries == set(entries), f"layer {layer}: the doc lists {sorted(doc_entries)}"
        assert doc_may == allowed[layer], f"layer {layer}: the doc says it may import {sorted(doc_may)}"
