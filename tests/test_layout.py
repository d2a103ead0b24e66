"""The toolkit's layout: no import cycles among replayssm_cli's modules, no Triton kernel outside replayssm_kernels."""

from __future__ import annotations

import ast
from pathlib import Path

import replayssm_cli

ROOT = Path(replayssm_cli.__file__).parent


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Every replayssm_cli module `name` imports, at module level or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in mods and m != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        stack.pop()
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_layout_has_no_import_cycle():
    mods = _modules()
    graph = {name: _imports(name, path, mods) for name, path in mods.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
    # the check itself sees a cycle
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_layout_keeps_every_triton_kernel_in_the_kernel_package():
    jitted = [f"{path.relative_to(ROOT.parent)}:{node.lineno}"
              for path in ROOT.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list)]
    assert not jitted, f"Triton kernels outside replayssm_kernels: {jitted}"


# presets.py reads Hugging Face's model_type strings.
OP_NAME_ALLOWED = {"model/ops.py", "model/presets.py"}


def test_layout_asks_the_op_adapter_instead_of_comparing_op_names():
    found = []
    for path in ROOT.rglob("*.py"):
        where = str(path.relative_to(ROOT))
        if where in OP_NAME_ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
                names = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                if {"mamba2", "gdn"} & set(names):
                    found.append(f"{where}:{node.lineno}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                if {"Mamba2Shape", "GDNShape"} & {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}:
                    found.append(f"{where}:{node.lineno}")
    assert not found, f"branches on an op's name or shape type (ask replayssm_cli.model.ops): {found}"
