"""The import structure of ``gpufleet/`` against the layers of docs/design.md ("Layers"): every module's imports
(also those inside functions) are read with :mod:`ast`, and

* no two modules import each other, directly or through others (an import circle);
* no module imports one of a higher layer (:data:`LAYERS`, the table docs/design.md describes);
* no module imports a private (``_name``) module or name of another package: what other packages use has a public
  name (``gpufleet._pyinfra`` is the one door: its public names and public modules are for every package);
* no module outside ``gpufleet/_pyinfra/`` uses pyinfra beyond its public API (:func:`pyinfra_internals`, the
  definition docs/design.md repeats, section "pyinfra internals: gpufleet/_pyinfra").

Where today's code breaks a rule, :data:`KNOWN` names it; the test fails when a new one appears and also when a
known one is gone without being taken off the list, so the list only shrinks."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gpufleet"

# Layer of each package or module (the longest matching name counts); a module may import modules of its own layer
# or lower ones. Kept in step with docs/design.md, section "Layers".
LAYERS: dict[str, int] = {
    # 0: leaves, imported from anywhere: node-side programs (they run alone on a node) and small shared helpers
    "gpufleet.catalog": 0,
    "gpufleet.masking": 0,
    "gpufleet.control_files": 0,
    "gpufleet.web_auth": 0,
    "gpufleet.fleet_ca": 0,
    "gpufleet.interruption": 0,
    "gpufleet.probe": 0,
    "gpufleet.exporter": 0,
    "gpufleet.node": 0,
    # 1: the validated configuration; where node-side files are found; the one Slurm client
    "gpufleet.config": 1,
    "gpufleet.resources": 1,
    "gpufleet.slurm": 1,
    # 2: the node plan; SSH bounds (read from the configuration); gpufleet's one door to pyinfra's internals
    #    (gpufleet._pyinfra) and the pyinfra CLI's options as gpufleet's commands take them
    "gpufleet.plan": 2,
    "gpufleet.connection": 2,
    "gpufleet._pyinfra": 2,
    "gpufleet.pyinfra_args": 2,
    # 3: facts: parse, never decide
    "gpufleet.facts": 3,
    # 4: operations and the preflight checks: decide from the plan and the facts
    "gpufleet.operations": 4,
    "gpufleet.preflight": 4,
    "gpufleet.preflight_repository": 4,
    # 5: the deploys of a GPU node and their validated inputs
    "gpufleet.deploys": 5,
    # 6: verify's model, checks and engines (SSH, Slurm)
    "gpufleet.verify": 6,
    # 7: reports render verify's model
    "gpufleet.report": 7,
    # 8: the verify command (runs the engines, writes the reports); monitoring, whose rules come from verify's
    #    thresholds and the reports' regressions, and the monitoring host's deploy built from it
    "gpufleet.verify.run": 8,
    "gpufleet.verify.pyinfra_entry": 8,
    "gpufleet.verify.workers": 8,
    "gpufleet.monitoring": 8,
    "gpufleet.deploys.monitoring": 8,
    # 9: commands on top: rollout (runs verify; its in-process pyinfra runs), drift, the settings table of every
    #    layer, the simulated fleet
    "gpufleet.rollout": 9,
    "gpufleet._pyinfra.inprocess": 9,
    "gpufleet.drift": 9,
    "gpufleet.catalog_command": 9,
    "gpufleet.settings": 9,
    "gpufleet.sim": 9,
    "gpufleet.apply": 9,
    "gpufleet._pyinfra.workers": 9,
    # 10: the command line
    "gpufleet.cli": 10,
    "gpufleet.__main__": 10,
}

# Today's breaks of the rules, each to be fixed (then taken off). ("circle", modules...) | ("up", importer,
# imported) | ("private", importer, imported module, name)
KNOWN: set[tuple[str, ...]] = {
    ("private", "gpufleet.preflight_repository", "gpufleet.operations._packaging", ""),
}


DOOR = "gpufleet._pyinfra"


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = modules()


def _module_of(name: str) -> str | None:
    """The module (file) that ``name`` is or lies in: ``gpufleet.verify.run.HostRun`` -> ``gpufleet.verify.run``."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> Iterator[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every gpufleet import of ``module``, at any depth."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return imports_in(path.read_text(), package)


def imports_in(source: str, package: str) -> Iterator[tuple[str, str | None, int]]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "gpufleet":
                    yield _module_of(alias.name) or alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.split(".")[0] != "gpufleet":
                continue
            for alias in node.names:
                target = _module_of(f"{source}.{alias.name}")
                if target == f"{source}.{alias.name}":  # a submodule: ``from gpufleet.verify import slurm``
                    yield target, None, node.lineno
                else:
                    yield _module_of(source) or source, alias.name, node.lineno


GRAPH = {m: sorted({t for t, _, _ in imports(m) if t != m}) for m in MODULES}


def layer(module: str) -> int:
    if module == "gpufleet":  # the package's own (empty) __init__
        return 0
    match = max((name for name in LAYERS if module == name or module.startswith(name + ".")), key=len, default=None)
    assert match is not None, f"{module} has no layer: add it to LAYERS here and to docs/design.md (Layers)"
    return LAYERS[match]


def package_of(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def circles(graph: dict[str, list[str]]) -> list[tuple[str, ...]]:
    """Each import circle once, as its modules from the alphabetically first (Tarjan's strongly connected
    components, then one cycle through each)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = []
    for component in components:
        members = set(component)
        start = min(component)
        # shortest way back to start within the component
        paths = {start: [start]}
        queue = [start]
        cycle = None
        while queue and cycle is None:
            v = queue.pop(0)
            for w in graph[v]:
                if w == start:
                    cycle = paths[v]
                    break
                if w in members and w not in paths:
                    paths[w] = [*paths[v], w]
                    queue.append(w)
        found.append(tuple(cycle or sorted(component)))
    return sorted(found)


def breaks() -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = {("circle", *c) for c in circles(GRAPH)}
    for module in MODULES:
        for target, name, _line in imports(module):
            if target == module:
                continue
            if layer(target) > layer(module):
                found.add(("up", module, target))
            if package_of(target) != package_of(module) and not package_of(module).startswith(package_of(target)):
                own = package_of(module).split(".")
                parts = target.split(".")
                common = next((i for i, (a, b) in enumerate(zip(own, parts, strict=False)) if a != b),
                              min(len(own), len(parts)))
                if parts[:2] == DOOR.split("."):  # the one door to pyinfra: only its own private parts count
                    common = max(common, 2)
                private_module = any(part.startswith("_") and not part.startswith("__") for part in parts[common:])
                if private_module or (name and name.startswith("_")):
                    found.add(("private", module, target, name or ""))
    return found


def test_every_module_has_a_layer():
    for module in MODULES:
        layer(module)


def test_no_new_import_circle_upward_import_or_private_import_across_packages():
    found = breaks()
    new = sorted(found - KNOWN)
    assert not new, "imports against docs/design.md (Layers):\n" + "\n".join(" ".join(b) for b in new)


def test_the_known_breaks_are_all_still_there():
    gone = sorted(KNOWN - breaks())
    assert not gone, "fixed: take these off KNOWN in tests/unit/test_layers.py:\n" + "\n".join(
        " ".join(b) for b in gone)


def test_a_circle_is_found_and_named():
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"], "e": ["e2"], "e2": ["e"]}
    assert circles(graph) == [("a", "b", "c"), ("e", "e2")]
    assert circles({"a": ["b"], "b": []}) == []


def test_imports_inside_functions_and_relative_imports_are_read():
    source = (
        "import gpufleet.plan\n"
        "from gpufleet.verify import model, evaluate_host\n"
        "from ..facts import nvidia\n"
        "def f():\n"
        "    from .checks import _private_name\n"
        "    import os\n"
    )
    assert sorted(imports_in(source, "gpufleet.verify")) == [
        ("gpufleet.facts.nvidia", None, 3),  # from the parent package
        ("gpufleet.plan", None, 1),
        ("gpufleet.verify", "evaluate_host", 2),  # a name of the package's __init__
        ("gpufleet.verify.checks", "_private_name", 5),  # inside a function
        ("gpufleet.verify.model", None, 2),
    ]


# ------------------------------------------------------------------------------------------- pyinfra internals
# What "pyinfra's public API" is here (docs/design.md, "pyinfra internals: gpufleet/_pyinfra", says the same). A
# module outside gpufleet/_pyinfra may use:
#
# * from ``pyinfra``: the context objects and the logger (:data:`PUBLIC_TOP`);
# * ``pyinfra.api``: the names its ``__init__`` exports (``operation``, ``deploy``, ``FactBase``, ``StringCommand``,
#   ``Config``, ``State``, ``Inventory``, ...: :func:`api_exports`, read from the installed pyinfra), pyinfra's
#   exceptions (``pyinfra.api.exceptions``) and the pluggable output formatter (``pyinfra.api.output``);
# * ``pyinfra.context``, ``pyinfra.operations`` and ``pyinfra.facts`` with everything in them.
#
# Everything else is internal: any other ``pyinfra.api`` module (``pyinfra.api.facts.get_fact``,
# ``pyinfra.api.arguments``, ``pyinfra.api.state``, ``pyinfra.api.operations.run_ops``, ...), ``pyinfra.connectors``,
# ``pyinfra_cli``; reading or writing the State, Host and connector attributes of :data:`INTERNAL_ATTRIBUTES`; and
# any monkeypatching: assigning (or ``setattr``/``del``) an attribute of a name imported from pyinfra, or an
# attribute named like a Host/connector I/O method, or ``__class__``.
PUBLIC_TOP = {"host", "inventory", "state", "config", "logger"}
PUBLIC_MODULES = ("pyinfra.context", "pyinfra.operations", "pyinfra.facts")
PUBLIC_API_MODULES = ("pyinfra.api.exceptions", "pyinfra.api.output")
INTERNAL_ATTRIBUTES = {
    # State
    "active_hosts", "activated_hosts", "activate_host", "fail_hosts", "pool", "current_stage", "set_stage",
    "should_check_for_changes", "get_op_meta", "is_cli",
    # Host
    "connector", "connector_cls", "connector_data", "executing_op_hash", "nested_executing_op_hash",
    "current_op_hash", "in_op",
}
IO_METHODS = {"get_fact", "run_shell_command", "connect", "disconnect", "put_file", "get_file", "rsync", "__class__"}


def api_exports() -> set[str]:
    """The names ``pyinfra/api/__init__.py`` (the installed pyinfra's) imports for its users."""
    import pyinfra.api

    tree = ast.parse(Path(pyinfra.api.__file__).read_text())
    return {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            for alias in node.names}


def pyinfra_internals(source: str, exports: set[str] | None = None) -> list[tuple[str, int]]:
    """(what, line) for every use of pyinfra beyond its public API in ``source`` (see above)."""
    exports = api_exports() if exports is None else exports
    found: list[tuple[str, int]] = []
    from_pyinfra: set[str] = set()  # local names bound to something imported from pyinfra

    def top(name: str) -> str:
        return name.split(".")[0]

    def public_module(module: str) -> bool:
        return any(module == m or module.startswith(m + ".") for m in (*PUBLIC_MODULES, *PUBLIC_API_MODULES))

    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if top(alias.name) in ("pyinfra", "pyinfra_cli"):
                    from_pyinfra.add((alias.asname or alias.name).split(".")[0])
                    if alias.name not in ("pyinfra", "pyinfra.api") and not public_module(alias.name):
                        found.append((f"import {alias.name}", node.lineno))
        elif isinstance(node, ast.ImportFrom) and not node.level and top(node.module or "") in ("pyinfra",
                                                                                                "pyinfra_cli"):
            module = node.module or ""
            for alias in node.names:
                from_pyinfra.add(alias.asname or alias.name)
                if module == "pyinfra":
                    ok = alias.name in PUBLIC_TOP or public_module(f"pyinfra.{alias.name}")
                elif module == "pyinfra.api":
                    ok = alias.name in exports or public_module(f"pyinfra.api.{alias.name}")
                else:
                    ok = public_module(module)
                if not ok:
                    found.append((f"from {module} import {alias.name}", node.lineno))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in INTERNAL_ATTRIBUTES:
            found.append((f".{node.attr}", node.lineno))
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") \
                and node.args:
            first = node.args[0]
            name = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else None
            if (isinstance(first, ast.Name) and first.id in from_pyinfra) or name in IO_METHODS:
                found.append((f"{node.func.id}({ast.unparse(first)}, ...)", node.lineno))
        for target in (t for t in targets for t in ast.walk(t) if isinstance(t, ast.Attribute)):
            base = target.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if target.attr in IO_METHODS or (isinstance(base, ast.Name) and base.id in from_pyinfra):
                found.append((f"{ast.unparse(target)} = ...", node.lineno))
    return sorted(set(found), key=lambda item: (item[1], item[0]))


def test_no_module_outside_pyinfra_door_uses_pyinfra_internals():
    exports = api_exports()
    found = []
    for module, path in MODULES.items():
        if module == DOOR or module.startswith(DOOR + "."):
            continue
        found += [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
                  for what, line in pyinfra_internals(path.read_text(), exports)]
    assert not found, ("pyinfra beyond its public API outside gpufleet/_pyinfra (move it behind gpufleet._pyinfra, "
                       "docs/design.md):\n" + "\n".join(found))


def test_the_door_is_where_the_internals_are():
    """The rule finds what it is for: gpufleet/_pyinfra's own modules use exactly such internals."""
    found = {what for module, path in MODULES.items() if module.startswith(DOOR)
             for what, _ in pyinfra_internals(path.read_text())}
    assert {"from pyinfra.api.facts import get_fact", ".connector", ".in_op", "host.get_fact = ...",
            "connector.__class__ = ...", "from pyinfra_cli.inventory import make_inventory",
            "from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS"} <= found


def test_what_counts_as_pyinfra_internal():
    exports = {"operation", "FactBase", "StringCommand", "State", "Config"}
    public = (
        "from pyinfra import host, inventory, state, logger\n"
        "from pyinfra.api import operation, FactBase, State, Config\n"
        "from pyinfra.api.exceptions import PyinfraError\n"
        "from pyinfra.api.output import format_text\n"
        "from pyinfra.context import ctx_host\n"
        "from pyinfra.operations import apt, server\n"
        "from pyinfra.operations.util.files import generate_color_diff\n"
        "from pyinfra.facts.server import Arch\n"
        "import pyinfra.facts.files\n"
        "def f(run):\n"
        "    run.cwd = '/srv'\n"  # an attribute of a name not imported from pyinfra: data, not a patch
        "    if state.is_executing: host.noop('x')\n"
    )
    assert pyinfra_internals(public, exports) == []
    internal = (
        "from pyinfra.api.facts import get_fact\n"  # 1
        "from pyinfra.api import run_ops\n"  # 2: not exported by pyinfra.api
        "from pyinfra.api.state import StateStage\n"  # 3
        "from pyinfra.connectors.util import CommandOutput\n"  # 4
        "from pyinfra_cli.util import exec_file\n"  # 5
        "import pyinfra\n"  # 6: fine by itself...
        "def f(h, state):\n"
        "    pyinfra.is_cli = True\n"  # 8: ...but not patching it
        "    h.connect = lambda: None\n"  # 9
        "    for x in state.active_hosts: pass\n"  # 10
        "    h.connector.client\n"  # 11
        "    setattr(h, 'run_shell_command', None)\n"  # 12
        "    host.data = {}\n"  # 13: an object imported from pyinfra
        "from pyinfra import host\n"
        "import pyinfra.api.arguments\n"  # 15
    )
    assert [line for _, line in pyinfra_internals(internal, exports)] == [
        1, 2, 3, 4, 5, 8, 8, 9, 10, 11, 12, 13, 15]
