"""The import graph of ladderize runs one way: no cycle between its packages nor between its files, nothing imports
the package root, nothing imports the scripts of ``benchmarks/`` and ``lab/``, and each class name is defined once.

Every ``import`` in every module counts, function-level (lazy) imports included, since a lazy import
is still an arrow. A package node is a subpackage (``model``, ``adapt``, ...) or a module at the root
(``errors``, ``hardware``, ...); ``ladderize`` is the root ``__init__``, which only hands names on; a file
node is one module (a package's ``__init__`` is the package's). docs/architecture.md records the package
edges this test prints.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[1] / "ladderize"
ROOT = "ladderize"


def _node(module: str) -> str:
    """``ladderize.checkpoint.tensor_files`` -> ``model``; ``ladderize.errors`` -> ``errors``; ``ladderize`` -> ``ladderize``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def _imported(file: Path) -> list[tuple[str, int]]:
    """The ladderize modules ``file`` imports (absolute dotted names) and the line of each import."""
    parts = list(file.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = parts[:-1]  # the package a relative import starts from (an __init__'s own package too)
    found = []
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:  # `from . import errors` imports a module; `from .. import x` may name an attribute
                sub = PACKAGE.parent.joinpath(*module.split("."), alias.name)
                is_module = sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file()
                found.append((f"{module}.{alias.name}" if is_module else module, node.lineno))
    return [(name, line) for name, line in found if name.split(".")[0] == ROOT]


def _module_of(name: str) -> str | None:
    """The ladderize module (a file, or a package's ``__init__``) that the dotted ``name`` imports: the name itself, or
    the nearest module above it (``ladderize.model.Layout`` -> ``ladderize.model``); None for a folder without one."""
    parts = name.split(".")
    while parts:
        path = PACKAGE.parent.joinpath(*parts)
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return ".".join(parts)
        if path.is_dir():
            return None
        parts.pop()
    return None


def _module_name(file: Path) -> str:
    parts = list(file.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def file_graph() -> dict[tuple[str, str], list[str]]:
    """``(importer, imported) -> ["file:line", ...]`` between distinct modules."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for file in sorted(PACKAGE.rglob("*.py")):
        source = _module_name(file)
        for name, line in _imported(file):
            target = _module_of(name)
            where = f"{file.relative_to(PACKAGE.parent).as_posix()}:{line}"
            if target and target != source and where not in edges[source, target]:
                edges[source, target].append(where)
    return dict(edges)


def import_graph() -> dict[tuple[str, str], list[str]]:
    """``(importer, imported) -> ["file:line", ...]`` between distinct nodes."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for file in sorted(PACKAGE.rglob("*.py")):
        rel = file.relative_to(PACKAGE.parent)
        parts = list(rel.with_suffix("").parts)
        source = ROOT if parts[-1] == "__init__" and len(parts) == 2 else _node(".".join(parts))
        for module, line in _imported(file):
            target = _node(module)
            if target != source:
                edges[source, target].append(f"{rel.as_posix()}:{line}")
    return dict(edges)


def find_cycle(edges) -> list[str] | None:
    graph = defaultdict(set)
    for source, target in edges:
        graph[source].add(target)
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_package_import_graph_is_acyclic():
    edges = import_graph()
    for (source, target), where in sorted(edges.items()):
        print(f"{source} -> {target}  ({len(where)}: {where[0]})")
    assert ("model", "adapt") not in edges  # a sanity check that the graph sees the packages at all
    assert ("adapt", "model") in edges and ("convert", "checkpoint") in edges and ("checkpoint", "model") in edges
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle) + "; " + "; ".join(
        f"{a} -> {b} at {', '.join(edges[a, b])}" for a, b in zip(cycle, cycle[1:])
    )


def test_no_file_is_in_an_import_cycle():
    """Between files too: a function-level import that closes a loop is a shared piece in the wrong room."""
    edges = file_graph()
    assert ("ladderize.convert.conversion", "ladderize.checkpoint.io") in edges  # the graph sees the files
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle between files: " + " -> ".join(cycle) + "; " + "; ".join(
        f"{a} -> {b} at {', '.join(edges[a, b])}" for a, b in zip(cycle, cycle[1:])
    )


def test_convert_imports_nothing_of_adapt():
    """Convert's features (auto ranges, sensitivity, head grouping) stand below adapt, which may use them."""
    edges = import_graph()
    assert ("convert", "adapt") not in edges, edges.get(("convert", "adapt"))


def test_nothing_imports_the_benchmarks_or_the_lab():
    """``benchmarks/`` and ``lab/`` are scripts that use ladderize; ladderize reads nothing of theirs."""
    root = PACKAGE.parent
    scripts = {"benchmarks", "lab"} | {f.stem for folder in ("benchmarks", "lab") for f in (root / folder).glob("*.py")}
    found = []
    for file in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            found += [f"{file.relative_to(root).as_posix()}:{node.lineno} imports {name}"
                      for name in names if name.split(".")[0] in scripts]
    assert not found, found


def test_each_class_name_is_defined_once():
    """One name per idea: two classes of one name in the package read as one thing and are two."""
    where: dict[str, list[str]] = defaultdict(list)
    for file in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{file.relative_to(PACKAGE.parent).as_posix()}:{node.lineno}")
    twice = {name: places for name, places in where.items() if len(places) > 1}
    assert not twice, twice


def test_nothing_imports_the_package_root():
    up = [w for (source, target), where in import_graph().items() if target == ROOT for w in where]
    assert not up, f"imports of the package root (import the name from the module that defines it): {up}"


def test_the_portable_model_imports_nothing_else_of_ladderize():
    """``ladderize/model/`` is what travels inside a checkpoint (``auto_map`` remote code): its files import
    one another and nothing else of ladderize, and it holds exactly the code files a checkpoint carries."""
    from ladderize.model.configuration_ladder_llama import CODE_FILES

    outside = [
        f"{file.relative_to(PACKAGE.parent).as_posix()}:{line} imports {name}"
        for file in sorted((PACKAGE / "model").glob("*.py"))
        for name, line in _imported(file)
        if not name.startswith(f"{ROOT}.model.") and name != f"{ROOT}.model"
    ]
    assert not outside, "the portable model reaches outside itself: " + "; ".join(outside)
    assert {(f.name) for f in (PACKAGE / "model").glob("*.py")} == set(CODE_FILES) | {"__init__.py"}
    assert not [d for d in (PACKAGE / "model").iterdir() if d.is_dir() and d.name != "__pycache__"]
    edges = import_graph()
    assert not [target for (source, target) in edges if source == "model"]


def test_the_graph_sees_lazy_and_relative_imports(tmp_path):
    # a lazy import inside a method closes a cycle as surely as one at the top of the file
    assert find_cycle({("a", "b"): [], ("b", "c"): [], ("c", "a"): []}) == ["a", "b", "c", "a"]
    assert find_cycle({("a", "b"): [], ("b", "c"): []}) is None
    file = PACKAGE / "cli" / "app.py"
    assert any(name == "ladderize.version" for name, _ in _imported(file))  # `from ..version import __version__`, in a function


def test_the_planning_side_imports_no_training():
    """What chooses and prices a run's strategy (``adapt/plan/strategy_choice.py``, ``cost.py``, ``adapt_plan.py``) reads
    settings and shapes: it imports neither training run (``replicated``, ``sharded``), and the strategy no training module
    at all; the run and the pricing read the same choice."""
    edges = file_graph()
    plan, train = f"{ROOT}.adapt.plan", f"{ROOT}.adapt.train"
    training = ({f"{train}.{name}" for name in ("replicated", "sharded")} | {f"{ROOT}.adapt.stage_run"}
                | {f"{ROOT}.adapt.sequential.{name}" for name in ("layer_training", "sequential_run")})
    runs = {f"{train}.replicated", f"{train}.sharded"}
    for planner, barred in (("strategy_choice", training), ("cost", runs), ("adapt_plan", runs)):
        found = {target: where for (source, target), where in edges.items()
                 if source == f"{plan}.{planner}" and target in barred}
        assert not found, f"{planner} imports training: {found}"
    assert (f"{ROOT}.adapt.stage_run", f"{plan}.strategy_choice") in edges  # the run reads the same choice
    assert (f"{plan}.cost", f"{plan}.strategy_choice") in edges


def _from_imports(file: Path) -> list[tuple[str, str, int]]:
    """``(module, name, line)`` for every ``from MODULE import name`` of ``file`` whose name is not a module itself
    (absolute dotted module, relative imports resolved as ``_imported`` resolves them)."""
    package = list(file.relative_to(PACKAGE.parent).with_suffix("").parts)[:-1]
    found = []
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found += [(module, alias.name, node.lineno) for alias in node.names
                      if _module_of(f"{module}.{alias.name}") != f"{module}.{alias.name}"]
    return found


def test_planning_modules_import_no_training_module():
    """The planning side of adapt (``adapt/plan/``: what a run will do and cost, built before any weight loads: the
    settings, recipes, budget, strategy, cost and time model, and the counting they share with the run; and the
    objectives' registry, ``adapt/objectives/registry.py``) imports no module of the training side (``adapt/train/``,
    ``adapt/sequential/``, the losses ``adapt/objectives/losses.py``), not even through another module and not even
    in a function, and with no exception. Where plan and run count the same thing (a sequential stage's windows,
    epochs, steps and state copies), the count lives on the planning side (``sequential_schedule.py``) and the run
    imports it.

    - ``train/pace.py`` measures: it times a converted layer's real training step and kd's head on this device, so it
      is training; a plan that needs this device's pace says so (``budget.PaceNeeded``), the entrance times it
      (``entrance.with_timed_pace``) and hands the pace to the plan as data (``build_plan``'s ``pace``), and the plan
      keeps it in ``plan/kept_paces.py``.
    """
    adapt = PACKAGE / "adapt"
    planning = {_module_name(file) for file in [*(adapt / "plan").glob("*.py"), adapt / "objectives" / "registry.py"]}
    training = {_module_name(file) for file in [*(adapt / "train").glob("*.py"), *(adapt / "sequential").glob("*.py"),
                                                adapt / "objectives" / "losses.py"]}
    assert len(planning) > 10 and len(training) > 10 and not planning & training
    edges = file_graph()

    def imports(module: str) -> list[str]:
        return sorted(target for source, target in edges if source == module and target.startswith(f"{ROOT}.adapt."))

    found = []
    for start in sorted(planning):
        seen, todo = {start}, [[start]]
        while todo:
            path = todo.pop()
            for target in imports(path[-1]):
                if target in training:
                    found.append(" -> ".join(p.removeprefix(f"{ROOT}.adapt.") for p in path + [target])
                                 + f" ({', '.join(edges[path[-1], target])})")
                elif target not in seen:
                    seen.add(target)
                    todo.append(path + [target])
    assert not found, "the planning side imports training: " + "; ".join(sorted(set(found)))
    assert (f"{ROOT}.adapt.entrance", f"{ROOT}.adapt.train.pace") in edges  # the run hands the plan its timing
    assert (f"{ROOT}.adapt.sequential.sequential_run", f"{ROOT}.adapt.plan.sequential_schedule") in edges  # the count
    assert (f"{ROOT}.adapt.objectives.losses", f"{ROOT}.adapt.objectives.registry") in edges  # the losses implement it


def adapt_rooms() -> dict[tuple[str, str], list[str]]:
    """Imports between adapt's rooms (its subpackages, and its modules at the top: ``entrance``, ``stage_run``, ...):
    ``(importer, imported) -> ["file:line", ...]``."""
    prefix = f"{ROOT}.adapt."
    rooms: dict[tuple[str, str], list[str]] = defaultdict(list)
    for (source, target), where in file_graph().items():
        if source.startswith(prefix) and target.startswith(prefix):
            pair = (source.removeprefix(prefix).split(".")[0], target.removeprefix(prefix).split(".")[0])
            if pair[0] != pair[1]:
                rooms[pair] += where
    return dict(rooms)


def test_adapts_rooms_depend_one_way():
    """adapt's rooms form floors: no two rooms import each other, not even through a third, nor in a function. What
    both stage kinds read (a model's layers, the teacher's kept states) is a room of its own (``layers``) below both;
    a stage run (``stage_run``) and the recipe's (``recipe_run``) stand above both; the objectives' losses import
    neither the plan nor the training (a strategy that shards the heads hands the loss its gathering)."""
    rooms = adapt_rooms()
    cycle = find_cycle(rooms)
    assert cycle is None, "adapt's rooms import in a circle: " + " -> ".join(cycle) + " (" + "; ".join(
        ", ".join(rooms[pair]) for pair in zip(cycle, cycle[1:])) + ")"
    below = {"sequential": {"train", "layers", "plan", "objectives"}, "train": {"layers", "plan", "objectives"},
             "plan": {"objectives"}}
    for room, under in below.items():
        assert not {target for source, target in rooms if source in under and target == room}, room
    assert ("stage_run", "sequential") in rooms and ("stage_run", "train") in rooms
    assert ("sequential", "layers") in rooms and ("train", "layers") in rooms


def test_the_planning_vocabulary_imports_no_torch():
    """The objectives' registry, the compile policy, the kept paces and adapt's entrance load without torch: a plan
    (and a refusal) reads them first, and the command line imports the entrance before anything heavy."""
    import subprocess
    import sys

    code = ("import sys; import ladderize.adapt.objectives.registry, ladderize.adapt.plan.compile_policy, "
            "ladderize.adapt.entrance, ladderize.adapt.request, "
            "ladderize.adapt.plan.kept_paces, ladderize.adapt.plan.settings_sections; assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
