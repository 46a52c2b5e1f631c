"""The import rules of docs/architecture.md, read from the source with ast (every import statement:
module level, function-local and under TYPE_CHECKING alike).

- torch is imported only inside piper_sim/torch_backend/;
- the schedule layer imports neither simpy, numpy nor torch (directly, or through what it imports);
- the engine (piper_sim/sim/) imports the flow network only through its face (`from piper_sim.network import
  ...`), never one of its modules; the network (piper_sim/network/) imports neither the engine nor torch
  (directly, or through what it imports);
- the analysis (piper_sim/analysis/: reports, tables, plots, comparison) does not load simpy;
- the point runner and store (piper_sim/points/) import none of the planner, the studies and reproduce,
  which run their points on them;
- the package import graph has no cycle. A node is a first-level subpackage of piper_sim (schedule,
  workload, sim, ...) or a top-level module (cli, simulate, config, ...); an edge is any import between
  two nodes, so a cycle closed only by a late import counts too;
- a function-local import is of a heavy or optional package (LATE_PACKAGES: torch, matplotlib's pyplot, pyarrow,
  perfetto, distributed) or in a module that loads its commands or its API on first use (LAZY_MODULES: the CLIs,
  piper_sim/__init__.py, the numpy-free config), and a comment says why; every other import is at the top.

Besides imports: a task's kind, stream or role is compared with its enum (piper_sim/workload/task_kinds.py), never
with a string; no module but config.py reads raw config sections; `Simulation` takes at most 6 parameters; no module
is longer than MAX_MODULE_LINES.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "piper_sim"


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. piper_sim.calibrate.calibration
    target: str  # the imported module, e.g. piper_sim.torch_backend.bench.runner
    line: int
    late: bool  # inside a function

    def where(self) -> str:
        return f"{self.module.replace('.', '/')}.py:{self.line}{' (function-local)' if self.late else ''}"


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str, package: Path) -> bool:
    """Whether a dotted piper_sim name is a module or package of the source tree."""
    path = package.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, package: Path) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the importing module's package, one level up per extra dot
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
    # `from piper_sim import testbed` imports the module piper_sim.testbed, not only piper_sim
    subs = [f"{base}.{alias.name}" for alias in node.names if _is_module(f"{base}.{alias.name}", package)]
    return subs or [base]


def _late_nodes(tree: ast.Module) -> set[int]:
    return {
        id(n)
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
        for n in ast.walk(f)
        if isinstance(n, ast.Import | ast.ImportFrom)
    }


def imports(package: Path = PACKAGE) -> Iterator[Import]:
    """Every import statement of every module of the package."""
    for path in sorted(package.rglob("*.py")):
        module = _module_name(path, package)
        tree = ast.parse(path.read_text(), filename=str(path))
        late = _late_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(node, module, path.name == "__init__.py", package):
                    yield Import(module, target, node.lineno, id(node) in late)


def node_of(module: str) -> str | None:
    """The graph node of a piper_sim module (its first-level subpackage, or the top-level module)."""
    parts = module.split(".")
    if parts[0] != "piper_sim":
        return None
    return parts[1] if len(parts) > 1 else "piper_sim"


def package_graph() -> dict[tuple[str, str], list[Import]]:
    """(importing node, imported node) -> the imports that make that edge."""
    edges: dict[tuple[str, str], list[Import]] = {}
    for imp in imports():
        a, b = node_of(imp.module), node_of(imp.target)
        if b is not None and a != b:
            edges.setdefault((a, b), []).append(imp)
    return edges


def _successors(edges: dict[tuple[str, str], list[Import]]) -> dict[str, list[str]]:
    succ: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        succ.setdefault(a, []).append(b)
        succ.setdefault(b, [])
    return succ


def tangles(edges: dict[tuple[str, str], list[Import]]) -> list[list[str]]:
    """The strongly connected sets of two or more nodes (Tarjan): every cycle lies inside one."""
    succ = _successors(edges)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return components


def find_cycles(edges: dict[tuple[str, str], list[Import]]) -> list[list[str]]:
    """One shortest cycle through the first node of each tangle."""
    succ = _successors(edges)
    return [_cycle_in(component, succ) for component in tangles(edges)]


def _cycle_in(component: list[str], succ: dict[str, list[str]]) -> list[str]:
    """A shortest cycle through the component's first node (breadth-first, inside the component)."""
    start, inside = component[0], set(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in succ[v]:
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if w in inside and w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")


def _describe(component: list[str], edges: dict[tuple[str, str], list[Import]]) -> str:
    cycle = _cycle_in(component, _successors(edges))
    lines = [f"{', '.join(component)}: for example {' -> '.join(cycle)}; the imports between them:"]
    for (a, b), found in sorted(edges.items()):
        if a in component and b in component:
            lines += [f"    {a} -> {b}: {imp.where()} imports {imp.target}" for imp in found]
    return "\n".join(lines)


def test_nothing_outside_torch_backend_imports_torch():
    offenders = [
        imp
        for imp in imports()
        if imp.target.split(".")[0] == "torch" and not imp.module.startswith("piper_sim.torch_backend")
    ]
    assert not offenders, "torch imported outside piper_sim/torch_backend/:\n" + "\n".join(
        f"  {imp.where()}: {imp.target}" for imp in offenders
    )


FORBIDDEN_IN_SCHEDULE = ("simpy", "numpy", "torch")


def test_schedule_imports_neither_simpy_numpy_nor_torch():
    offenders = [
        imp
        for imp in imports()
        if imp.module.startswith("piper_sim.schedule") and imp.target.split(".")[0] in FORBIDDEN_IN_SCHEDULE
    ]
    assert not offenders, "the schedule layer imports " + ", ".join(
        f"{imp.target} ({imp.where()})" for imp in offenders
    )


def test_schedule_modules_load_neither_simpy_numpy_nor_torch():
    # what the schedule modules import must not bring these in either (a fresh interpreter)
    modules = [_module_name(p) for p in sorted((PACKAGE / "schedule").glob("*.py"))]
    code = (
        f"import sys\nfor m in {modules!r}:\n    __import__(m)\n"
        f"print(' '.join(m for m in {FORBIDDEN_IN_SCHEDULE!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert not out, f"importing piper_sim.schedule loads {out}"


def test_analysis_modules_load_no_simpy():
    # the report, tables, plots and comparison read results: nothing of the event engine (a fresh interpreter)
    modules = [_module_name(p) for p in sorted((PACKAGE / "analysis").glob("*.py"))]
    code = f"import sys\nfor m in {modules!r}:\n    __import__(m)\nprint('simpy' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "False", "importing piper_sim.analysis loads simpy"


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_sim_imports_the_network_only_through_its_face():
    offenders = [
        imp for imp in imports() if _within(imp.module, "piper_sim.sim") and imp.target.startswith("piper_sim.network.")
    ]
    assert not offenders, "piper_sim/sim/ imports the network's modules (import from piper_sim.network):\n" + "\n".join(
        f"  {imp.where()}: {imp.target}" for imp in offenders
    )


FORBIDDEN_IN_NETWORK = ("piper_sim.sim", "torch")


def test_network_imports_neither_the_engine_nor_torch():
    offenders = [
        imp
        for imp in imports()
        if _within(imp.module, "piper_sim.network") and any(_within(imp.target, f) for f in FORBIDDEN_IN_NETWORK)
    ]
    assert not offenders, "piper_sim/network/ imports " + ", ".join(
        f"{imp.target} ({imp.where()})" for imp in offenders
    )


def test_network_modules_load_neither_the_engine_nor_torch():
    # what the network's modules import must not bring these in either (a fresh interpreter)
    modules = [_module_name(p) for p in sorted((PACKAGE / "network").glob("*.py"))]
    code = (
        f"import sys\nfor m in {modules!r}:\n    __import__(m)\n"
        f"print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'"
        f" or m == 'piper_sim.sim' or m.startswith('piper_sim.sim.'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert not out, f"importing piper_sim.network loads {out}"


POINTS_CLIENTS = ("piper_sim.planning", "piper_sim.studies", "piper_sim.reproduce")


def test_points_import_none_of_the_commands_that_run_on_them():
    offenders = [
        imp
        for imp in imports()
        if _within(imp.module, "piper_sim.points") and any(_within(imp.target, c) for c in POINTS_CLIENTS)
    ]
    assert not offenders, "piper_sim/points/ imports " + ", ".join(f"{imp.target} ({imp.where()})" for imp in offenders)


def test_the_package_import_graph_has_no_cycle():
    edges = package_graph()
    found = tangles(edges)
    assert not found, "import cycles between packages (all imports, function-local included):\n" + "\n".join(
        _describe(component, edges) for component in found
    )


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({("a", "b"): [], ("b", "c"): []}, []),
        ({("a", "b"): [], ("b", "a"): []}, [["a", "b", "a"]]),
        ({("a", "b"): [], ("b", "c"): [], ("c", "a"): [], ("d", "a"): []}, [["a", "b", "c", "a"]]),
    ],
)
def test_find_cycles_reports_one_cycle_per_tangle(edges, expected):
    assert find_cycles(edges) == expected


def test_the_analyser_sees_late_relative_and_submodule_imports(tmp_path):
    pkg = tmp_path / "piper_sim"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "other.py").write_text("")
    (pkg / "sub" / "mod.py").write_text(
        "from . import sibling\nfrom piper_sim import other\n\ndef f():\n    import torch\n"
    )
    (pkg / "sub" / "sibling.py").write_text("")
    found = {(i.target, i.late) for i in imports(pkg)}
    assert found == {("piper_sim.sub.sibling", False), ("piper_sim.other", False), ("torch", True)}


VOCABULARY_ATTRIBUTES = ("kind", "stream", "role")  # a task's TaskKind, Stream and Role (workload/task_kinds.py)
# owners whose `kind` is another vocabulary: numpy's dtype character codes, a routing spec's registry name
OTHER_KINDS = ("dtype", "routing")


def _is_strings(node: ast.expr) -> bool:
    """A str constant, or a tuple, list or set of them."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return bool(node.elts) and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _is_vocabulary(node: ast.expr) -> bool:
    """`x.kind`, `x.stream` or `x.role`, but not a kind of OTHER_KINDS (`arr.dtype.kind`, `cfg.routing.kind`)."""
    if not (isinstance(node, ast.Attribute) and node.attr in VOCABULARY_ATTRIBUTES):
        return False
    owner = node.value
    return not (
        isinstance(owner, ast.Attribute)
        and owner.attr in OTHER_KINDS
        or isinstance(owner, ast.Name)
        and owner.id in OTHER_KINDS
    )


def spelled_vocabulary(path: Path) -> list[int]:
    """The lines of a module that compare a `.kind`, `.stream` or `.role` attribute with a string literal (or a
    tuple, list or set of them)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_vocabulary(s) for s in sides) and any(_is_strings(s) for s in sides):
                lines.append(node.lineno)
    return sorted(set(lines))


def test_kinds_streams_and_roles_are_compared_as_enums():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line in spelled_vocabulary(path)
    ]
    assert not offenders, (
        "a kind, stream or role compared with a string (use TaskKind, Stream, Role or the kind "
        "sets of piper_sim/workload/task_kinds.py):\n  " + "\n  ".join(offenders)
    )


def test_the_analyser_sees_spelled_kinds(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        'a = t.kind == "send"\nb = t.role in ("dispatch", "combine")\nc = "p2p" != t.stream\n'
        'd = t.kind == TaskKind.SEND\ne = kind == "send"\nf = t.name == "x"\ng = t.role not in {"tp"}\n'
        'h = a.dtype.kind == "f"\ni = cfg.routing.kind != "uniform"\n'
    )
    assert spelled_vocabulary(module) == [1, 2, 3, 7]


# Modules that may read a Config's raw sections (Config.raw) besides piper_sim/config.py, each with its reason: none
# (the config builds every section at load; resolved() writes the raw ones back out).
RAW_CONFIG_READERS: dict[str, str] = {}


def raw_config_reads(path: Path) -> list[int]:
    """The lines of a module that read a config's raw sections: `x.raw[...]`, `x.raw.get(...)`, or `cfg.raw` /
    `config.raw` whole."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "raw":
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "get"
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "raw"
        ):
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "raw"
            and isinstance(node.value, ast.Name)
            and node.value.id in ("cfg", "config")
        ):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_no_module_reads_raw_config_sections_outside_config():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "config.py" and _module_name(path) not in RAW_CONFIG_READERS
        for line in raw_config_reads(path)
    ]
    assert not offenders, (
        "raw config sections read outside piper_sim/config.py (take the built section from "
        "Config, or list the module in RAW_CONFIG_READERS with its reason):\n  " + "\n  ".join(offenders)
    )


def test_the_analyser_sees_raw_config_reads(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("a = cfg.raw['routing']\nb = x.raw.get('cost')\nc = config.raw\nd = spec.raw_bytes\n")
    assert raw_config_reads(module) == [1, 2, 3]


MAX_SIMULATION_PARAMETERS = 6


def test_simulation_takes_a_handful_of_built_objects():
    tree = ast.parse((PACKAGE / "sim" / "engine.py").read_text())
    init = next(
        f
        for c in ast.walk(tree)
        if isinstance(c, ast.ClassDef) and c.name == "Simulation"
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == "__init__"
    )
    args = init.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)][1:]  # less self
    assert len(names) <= MAX_SIMULATION_PARAMETERS and not args.vararg and not args.kwarg, names


# Function-local imports: each is of a heavy or optional package (LATE_PACKAGES) or in a module that loads its
# commands or its API on first use (LAZY_MODULES), and says why in a comment on its lines, the line above, or above
# the run of imports it belongs to (a noqa or type: ignore alone is no reason). Everything else imports at the top.
LATE_PACKAGES = {
    "torch": "the torch backend: loaded only where real ranks run",
    "piper_sim.torch_backend": "imports torch (measure, calibrate)",
    "matplotlib": "pyplot: heavy, only where plots are drawn (after the Agg backend is chosen)",
    "pyarrow": "optional (the parquet extra)",
    "perfetto": "optional (the perfetto extra)",
    "distributed": "heavy (~560 modules): only where points run on Dask",
}
LAZY_MODULES = {
    "piper_sim": "the public API on first use: every submodule's import runs piper_sim/__init__.py",
    "piper_sim.cli": "a command's modules (numpy, pandas, simpy, networkx) load when it runs, not for --help",
    "piper_sim.calibrate.cli": "as piper_sim.cli",
    "piper_sim.importers.cli": "as piper_sim.cli",
    "piper_sim.planning.cli": "as piper_sim.cli",
    "piper_sim.reproduce.cli": "as piper_sim.cli",
    "piper_sim.studies.cli": "as piper_sim.cli",
    "piper_sim.simulate_commands": "as piper_sim.cli",
    "piper_sim.run_commands": "as piper_sim.cli",
    "piper_sim.validate_commands": "as piper_sim.cli",
    "piper_sim.config": "loads no numpy: the schedule layer (numpy-free) and --help import it; its sections' "
    "parsers (collectives, migration, routing) load numpy and networkx",
    "piper_sim.profile_choice": "loads no numpy: config imports it; topology.load loads networkx and numpy",
    "piper_sim.stopping": "the CLI's first import, before its signal handlers are in place: multiprocessing "
    "(~5 ms) loads only where Dask starts",
    "piper_sim.testbed.tcp_probe": "its peers run the module (python -m) with the stdlib alone",
}
_NO_REASON = re.compile(r"(noqa(:\s*[A-Z]+\d+(\s*,\s*[A-Z]+\d+)*)?|type:\s*ignore(\[[^\]]*\])?)\s*")


def _reason_lines(source: str) -> set[int]:
    """The lines holding a comment that says something (not a noqa or type: ignore alone)."""
    return {
        tok.start[0]
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT and _NO_REASON.sub("", tok.string.lstrip("#").strip(), count=1)
    }


def _run_heads(tree: ast.Module) -> dict[int, ast.stmt]:
    """id(import) -> the first import of the run of consecutive import lines it belongs to."""
    heads: dict[int, ast.stmt] = {}
    for node in ast.walk(tree):
        for body in (getattr(node, name, None) for name in ("body", "orelse", "finalbody")):
            head = previous = None
            for stmt in body if isinstance(body, list) else ():
                if not isinstance(stmt, ast.Import | ast.ImportFrom):
                    head = previous = None
                    continue
                if previous is None or stmt.lineno != previous.end_lineno + 1:
                    head = stmt
                heads[id(stmt)], previous = head, stmt
    return heads


def late_import_offences(
    package: Path = PACKAGE, packages: dict[str, str] = LATE_PACKAGES, lazy: dict[str, str] = LAZY_MODULES
) -> list[str]:
    """Every function-local import that is neither of `packages` nor in a `lazy` module, or says no reason."""
    offences = []
    for path in sorted(package.rglob("*.py")):
        module, source = _module_name(path, package), path.read_text()
        tree = ast.parse(source, filename=str(path))
        late = _late_nodes(tree)
        if not late:
            continue
        reasons, heads = _reason_lines(source), _run_heads(tree)
        for node in ast.walk(tree):
            if id(node) not in late:
                continue
            where = f"{path.relative_to(package.parent)}:{node.lineno}"
            targets = _targets(node, module, path.name == "__init__.py", package)
            if module not in lazy and not all(any(_within(t, p) for p in packages) for t in targets):
                offences.append(f"{where}: {', '.join(targets)} (import it at the top)")
            elif not reasons & set(range(heads[id(node)].lineno - 1, node.end_lineno + 1)):
                offences.append(f"{where}: {', '.join(targets)} (say why it is late in a comment)")
    return offences


def test_function_local_imports_are_heavy_or_lazy_and_say_why():
    offences = late_import_offences()
    assert not offences, (
        "function-local imports that belong at the top, or that do not say why they are late "
        "(LATE_PACKAGES, LAZY_MODULES):\n  " + "\n  ".join(offences)
    )


def test_the_analyser_flags_late_imports(tmp_path):
    pkg = tmp_path / "piper_sim"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "other.py").write_text("")
    (pkg / "mod.py").write_text(
        "import json\n\n\ndef f():\n    from piper_sim import other\n\n\ndef g():\n"
        "    # matplotlib: heavy\n    import matplotlib\n    import matplotlib.pyplot as plt\n\n"
        "    import torch  # noqa: F401\n    from piper_sim.other import x  # why\n\n\n"
        "def h():\n    import json\n    import torch  # optional\n"
    )
    (pkg / "cli.py").write_text("def run():\n    from piper_sim import other\n    from piper_sim import mod  # heavy\n")
    assert late_import_offences(pkg, {"matplotlib": "", "torch": ""}, {"piper_sim.cli": ""}) == [
        "piper_sim/cli.py:2: piper_sim.other (say why it is late in a comment)",
        "piper_sim/mod.py:5: piper_sim.other (import it at the top)",
        "piper_sim/mod.py:13: torch (say why it is late in a comment)",
        "piper_sim/mod.py:14: piper_sim.other (import it at the top)",
        "piper_sim/mod.py:18: json (import it at the top)",
    ]


MAX_MODULE_LINES = 480  # a module holds one thing: past this, it holds two


def test_no_module_is_longer_than_the_limit():
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
