"""The repository's import graph: no circles, and kernels import no engine code (issue 16).

Every import statement of the packages counts, also the ones inside functions (a lazy import
still ties two modules together), and importing ``a.b.c`` depends on ``a`` and ``a.b`` too
(their ``__init__`` runs first). Read from the source with ``ast``: nothing is imported here.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("atomk31", "gluon_kernels", "flydsl_kernels", "server")
KERNEL_PACKAGES = ("atomk31.triton_kernels", "gluon_kernels", "flydsl_kernels")
ENGINE_PACKAGES = ("atomk31.ops", "atomk31.model", "atomk31.engine")


def module_files() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the repository modules it imports, each with its parent packages (whose
    ``__init__`` an import runs first) but for the packages the importer itself lies in."""
    modules = module_files()

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in modules:
                return ".".join(parts[:end])
        return None

    graph = {}
    for module, path in modules.items():
        own = {".".join(module.split(".")[:end]) for end in range(1, module.count(".") + 1)}
        targets = set()
        for name in imported_names(path):
            target = resolve(name)
            while target and target not in own:
                targets.add(target)
                target = target.rpartition(".")[0]
        graph[module] = targets - {module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_repository_has_no_import_circle():
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_kernel_modules_import_no_engine_code():
    graph = import_graph()
    bad = sorted(f"{module} imports {target}" for module, targets in graph.items()
                 if module.startswith(KERNEL_PACKAGES)
                 for target in targets if target.startswith(ENGINE_PACKAGES))
    assert not bad, "\n".join(bad)
