"""The layout's rules about imports (README, Development): they flow one way.

- `queue_app/bench/` and `queue_app/chaos/` are tooling that proves the product (benchmarks, fault injection).
  They live in the app because Django finds management commands only in installed apps; nothing of the
  product — worker, engine, admin, services, Spark, views — imports them, only their own two commands do.
- The engine (the SQL of the queue) imports nothing of the app but its settings: the worker, services and
  admin build on it, never the other way round.

Checked on the source with `ast` (every import statement, at module level or inside a function).
"""

import ast
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "queue_app"
TOOLING = ("queue_app.bench", "queue_app.chaos")
TOOLING_COMMANDS = {
    f"queue_app.management.commands.{name}" for name in ("queue_bench", "queue_chaos", "spark_bench", "webhook_bench")
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(APP.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, as absolute names (`from . import x` gives both the package and pkg.x)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)
    return found


def product_modules() -> dict[str, Path]:
    modules = {module_name(p): p for p in APP.rglob("*.py") if "migrations" not in p.parts}
    return {
        name: path for name, path in modules.items() if not name.startswith(TOOLING) and name not in TOOLING_COMMANDS
    }


def test_nothing_in_the_product_imports_the_bench_or_the_chaos_tooling():
    offenders = {
        name: sorted(m for m in imported_modules(path) if m.startswith(TOOLING))
        for name, path in product_modules().items()
    }
    assert len(offenders) > 40  # the walk found the app (worker, engine, admin, services, spark...)
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_the_tooling_is_reached_only_through_its_own_commands():
    users = {
        module_name(path)
        for path in APP.rglob("*.py")
        if not module_name(path).startswith(TOOLING) and any(m.startswith(TOOLING) for m in imported_modules(path))
    }
    assert users == TOOLING_COMMANDS


def test_the_engine_imports_nothing_of_the_app_but_its_settings():
    engine = {name: path for name, path in product_modules().items() if name.startswith("queue_app.engine")}
    assert "queue_app.engine.sql" in engine
    outside = {
        name: sorted(
            m
            for m in imported_modules(path)
            if m.startswith("queue_app") and not m.startswith(("queue_app.engine", "queue_app.conf"))
        )
        for name, path in engine.items()
    }
    assert {name: mods for name, mods in outside.items() if mods} == {}


def test_the_import_reader_resolves_relative_imports():
    """The checks above are only as good as this: a relative import of the tooling is seen."""
    path = APP / "worker" / "maintenance.py"  # from .. import engine, scheduling
    assert "queue_app.engine" in imported_modules(path)
    assert module_name(APP / "chaos" / "__init__.py") == "queue_app.chaos"
