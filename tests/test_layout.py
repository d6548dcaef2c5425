"""tasks/ is a house of rooms with floors (tasks/__init__.py): a module imports only from its own room or the rooms
below it, and nothing in tasks/ imports pipeline/. Read from the source's import statements, not from a list kept
beside them, so a new upward import fails here by name."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "tasks"

# From the floor up, as tasks/__init__.py tells it.
FLOORS = [("errors", "config_files", "old_paths"), ("io",), ("numerics",), ("plan",), ("source",), ("device",), ("entries",), ("stage",), ("places",)]
FLOOR_OF = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def _room(module: str) -> str:
    """'tasks.io.network' -> 'io'; 'tasks.plan' -> 'plan'."""
    return module.split(".")[1]


def _imports(tree: ast.Module):
    """Every module named in an import, wherever it stands (in a function, or under `if TYPE_CHECKING:`, which
    still ties the module to the one it names)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "tasks":
                yield from (f"tasks.{alias.name}" for alias in node.names)
            else:
                yield node.module


def _modules():
    for path in sorted(TASKS.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        if rel.parts[-1] == "__init__" and len(rel.parts) == 2:
            continue  # tasks/__init__.py itself: the map
        yield path, ".".join(rel.parts)


def test_every_room_has_a_floor_and_a_map():
    rooms = {p.name for p in TASKS.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    loose = {p.stem for p in TASKS.glob("*.py") if p.stem != "__init__"}
    assert rooms | loose == set(FLOOR_OF), "a room or loose module of tasks/ without a floor in this test"
    assert len(loose) <= 6, sorted(loose)
    for room in rooms:
        doc = ast.get_docstring(ast.parse((TASKS / room / "__init__.py").read_text())) or ""
        modules = {p.name for p in (TASKS / room).glob("*.py") if p.stem != "__init__"}
        assert all(f"`{name}`" in doc for name in modules), f"tasks/{room}/__init__.py does not map {sorted(modules)}"


def test_imports_go_only_down():
    upward = []
    for path, module in _modules():
        own = FLOOR_OF[_room(module)]
        for imported in _imports(ast.parse(path.read_text())):
            if imported.split(".")[0] == "pipeline":
                upward.append(f"{module} imports {imported} (pipeline/ is above tasks/)")
            elif imported.startswith("tasks.") and FLOOR_OF[_room(imported)] > own:
                upward.append(f"{module} imports {imported}")
    assert not upward, "\n".join(upward)
