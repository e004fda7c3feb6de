"""The package's structure, read from its source (ast): folders by stage of the data flow, each
importing only folders before it; the command folders (run, sweep, ...) never import each other, nor do
the thin command modules of ``commands/``; ``cli`` imported by nothing but ``__main__``; no import
circle between modules; no module named like a folder (``commands/`` aside: its modules are named by
their command).

Run ``python -m tests.test_architecture`` for the figures docs/architecture.md quotes
(modules per folder, import arrows, circles).
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ds_bench"
LAYERS = (
    ("errors", "logs"),
    ("config",),
    ("machine",),
    ("cluster",),
    ("data", "engines"),
    ("workloads",),
    ("measure",),
    ("record",),
    ("perf",),
    ("jobs",),
    ("report",),
    ("run", "sweep", "scaling", "capacity", "comm", "roofline", "plan"),
    ("commands",),
    ("cli", "__main__"),
)
"""Folders (or root modules) in data-flow order: each may import its own folder and those before it."""
COMMAND_FOLDERS = ("run", "sweep", "scaling", "capacity", "comm", "roofline", "plan")
"""The folders a command's implementation lives in: none imports another."""


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name (``ds_bench.x.y``) -> file, packages by their ``__init__``."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the ds_bench modules it imports (anywhere in the file, lazy imports included)."""
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, package):
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("ds_bench."):
                    graph[name].add(target)
    return graph


def _targets(node: ast.AST, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" for a in node.names]  # a submodule, else trimmed back to the module


def folder(module: str) -> str:
    """``ds_bench.cluster.join`` -> ``cluster``; ``ds_bench.errors`` -> ``errors``."""
    return module.split(".")[1] if "." in module else ""


def layer_of(module: str) -> int:
    top = folder(module)
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module}: folder {top!r} is in no layer of LAYERS; add it where it belongs")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each a circle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
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
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that breaks a rule, one line each."""
    out = []
    for src, targets in sorted(graph.items()):
        if src == "ds_bench":
            continue
        for dst in sorted(targets):
            if dst == "ds_bench":
                continue
            a, b = folder(src), folder(dst)
            if b == "cli":
                if a != "__main__":
                    out.append(f"{src} imports {dst}: nothing imports the CLI router")
            elif a in COMMAND_FOLDERS and b in COMMAND_FOLDERS and a != b:
                out.append(f"{src} imports {dst}: commands never import each other (share through jobs/ or report/)")
            elif a == b == "commands" and "ds_bench.commands" not in (src, dst):
                out.append(f"{src} imports {dst}: command modules never import each other (share the layer below)")
            elif a != b and layer_of(dst) >= layer_of(src):
                out.append(f"{src} imports {dst}: {b}/ comes after {a}/ in the data flow")
    return out


STUDIES = ("sweep", "scaling", "capacity")
"""Policies over the one runner (``jobs.runner``): each decides what to run next and starts ``ds-bench run`` as a job."""
RUN_PATH = ("run", "measure")


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def run_path_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every study module that reaches the run path (``run/``, ``measure/``), with what it reaches."""
    out = []
    for module in sorted(m for m in graph if folder(m) in STUDIES):
        bad = sorted(m for m in reachable(graph, module) if folder(m) in RUN_PATH)
        if bad:
            out.append(f"{module} reaches the run path: {', '.join(bad)} (a study starts ds-bench run as a job)")
    return out


def test_studies_never_import_the_run_path():
    assert run_path_imports(import_graph()) == []


def test_the_rules_hold_and_there_is_no_circle():
    graph = import_graph()
    assert violations(graph) == []
    assert cycles(graph) == []


def test_the_checker_sees_upward_imports_command_to_command_and_circles(tmp_path):
    pkg = tmp_path / "ds_bench"
    for name, text in {"__init__.py": "", "errors.py": "", "cli.py": "",
                       "config/__init__.py": "", "config/a.py": "from ds_bench.machine import b\n",
                       "machine/__init__.py": "", "machine/b.py": "from ds_bench.config import a\n",
                       "sweep/__init__.py": "", "sweep/main.py": "def f():\n    from ds_bench.scaling import main\n",
                       "scaling/__init__.py": "", "scaling/main.py": "from ds_bench import cli\n",
                       "commands/__init__.py": "", "commands/bench.py": "from ds_bench.commands import sweep\n",
                       "commands/sweep.py": "from ds_bench.sweep import main\n"}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    found = violations(graph)
    assert any("config.a imports ds_bench.machine.b" in v for v in found)
    assert any("sweep.main imports ds_bench.scaling.main: commands never" in v for v in found)
    assert any("scaling.main imports ds_bench.cli: nothing imports" in v for v in found)
    assert any("commands.bench imports ds_bench.commands.sweep: command modules never" in v for v in found)
    assert not any(v.startswith("ds_bench.commands.sweep") for v in found)
    assert cycles(graph) == [["ds_bench.config.a", "ds_bench.machine.b"]]
    graph["ds_bench.sweep.main"] |= {"ds_bench.report.x"}
    graph["ds_bench.report.x"] = {"ds_bench.measure.loop"}
    assert run_path_imports(graph) == ["ds_bench.sweep.main reaches the run path: ds_bench.measure.loop (a study "
                                       "starts ds-bench run as a job)"]


def name_clashes(root: Path = PACKAGE) -> list[str]:
    """Modules named like a folder of the package (``run/measure.py`` beside ``measure/``): one name, two
    things. A command module (``commands/run.py``) is named by its command, which its folder implements."""
    folders = {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return sorted(name for name, path in modules(root).items()
                  if path.stem in folders and folder(name) != "commands")


def test_no_module_is_named_like_a_folder(tmp_path):
    assert name_clashes() == []
    for name in ("__init__.py", "measure/__init__.py", "run/__init__.py", "run/measure.py", "commands/run.py"):
        (tmp_path / "ds_bench" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "ds_bench" / name).write_text("")
    assert name_clashes(tmp_path / "ds_bench") == ["ds_bench.run.measure"]


@pytest.mark.parametrize("module", sorted(modules()))
def test_every_module_says_what_it_owns(module):
    tree = ast.parse(modules()[module].read_text())
    assert ast.get_docstring(tree), f"{module}: no module docstring"


def summary() -> str:
    graph = import_graph()
    per_folder = collections.Counter(folder(m) or "(root)" for m in graph if m != "ds_bench")
    lines = [f"{len(graph)} modules, {sum(len(t) for t in graph.values())} import arrows, "
             f"{len(cycles(graph))} circles, {len(violations(graph))} rule violations"]
    lines += [f"  {name or '(root)'}: {count}" for name, count in sorted(per_folder.items())]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary())
