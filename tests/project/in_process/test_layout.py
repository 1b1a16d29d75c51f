"""The layout's rules about imports (README, Development): they flow one way.

- The app (`queue_app`) imports nothing of the jobsite project (`jobsite/`), not even `jobsite.spark_report`
  (the plain-Python module a PySpark script imports to report itself; the Spark app names the channel itself): an
  adopter's project installs the app without the project's settings, commands, demo or tooling.
- `jobsite/bench/` and `jobsite/chaos/` are tooling that proves the product (benchmarks, fault injection).
  They live in the project's own app (its commands); nothing of the product imports them, only their own
  commands do.
- The engine (the SQL of the queue) imports nothing of the app but its settings: the worker, services and
  admin build on it, never the other way round.
- The core (`queue_app` outside the layer apps `queue_app/spark/`, `workflows/`, `datasets/`, `webhooks/`) imports
  nothing of them (their models are their apps' own, each imported from its layer's `models` module): it reaches
  them through `queue_app/hooks.py`, publishes its events through `queue_app/events.py`, and declares datasets
  with its own vocabulary (`queue_app/dataset_refs.py`). A layer imports only the layers its AppConfig requires
  (LAYERS), the webhooks the workflows only when installed. NOT_YET_CUT (empty) would list a datasets edge not cut
  yet. Nor does the core's text name a layer: no core module or template names a layer's admin URL
  (`admin:jobsite_...`, `/admin/jobsite_...`) or a layer model's CSS class (`.model-sparkrun`, a column only a
  layer's list has); the layer's charts and list styles are its own.
- No two modules of `queue_app` or `jobsite` import each other, directly or through others (no import circle),
  counting imports inside functions too: a function-level import only hides a circle from Python, not from a
  reader. A package's `__init__` importing its own submodules is downward; a submodule importing its package's
  `__init__` back is the upward half of a circle.

Checked on the source with `ast` (every import statement, at module level or inside a function).
"""

import ast
from collections import deque
from pathlib import Path

from tests.support.paths import ROOT

APP = ROOT / "queue_app"
PROJECT = APP.parent / "jobsite"
TOOLING = ("jobsite.bench", "jobsite.chaos")
TOOLING_COMMANDS = {
    f"jobsite.management.commands.{name}"
    for name in ("admin_bench", "queue_bench", "queue_chaos", "spark_bench", "webhook_bench")
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


def test_the_app_imports_nothing_of_the_project():
    offenders = {
        name: sorted(m for m in imported_modules(path) if m.split(".")[0] == "jobsite")
        for name, path in product_modules().items()
    }
    assert len(offenders) > 40  # the walk found the app (worker, engine, admin, services, spark...)
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_the_tooling_is_reached_only_through_its_own_commands():
    users = {
        module_name(path)
        for root in (APP, PROJECT)
        for path in root.rglob("*.py")
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
    assert module_name(PROJECT / "chaos" / "__init__.py") == "jobsite.chaos"
    assert "queue_app.engine" in imported_modules(PROJECT / "chaos" / "runner.py")  # from queue_app import engine


def all_modules() -> dict[str, Path]:
    """Every module of queue_app and jobsite but the migrations (frozen history, imported by nothing)."""
    return {
        module_name(path): path
        for root in (APP, PROJECT)
        for path in root.rglob("*.py")
        if "migrations" not in path.parts
    }


def module_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules among `modules` that `path` imports, anywhere in the file (module level, functions, methods).

    `from pkg import name` is an import of the submodule pkg.name when there is one, else of pkg (the package's
    `__init__`); the packages above an imported module, which Python runs first, are not counted: importing
    pkg.sub does not import whatever pkg's `__init__` re-exports for others."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                target = f"{source}.{alias.name}"
                if target in modules:
                    found.add(target)
                elif source in modules:
                    found.add(source)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: module_imports(path, modules) for name, path in modules.items()}


def import_circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm): each is a set of modules
    that all reach each other through imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(frozenset(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def chain(graph: dict[str, set[str]], circle: frozenset[str]) -> str:
    """One circle through the component's first module, shortest first: "a -> b -> a"."""
    start = min(circle)
    came_from = {start: None}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for other in sorted(graph[module] & circle):
            if other == start:
                path = [module]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                return " -> ".join([*reversed(path), start])
            if other not in came_from:
                came_from[other] = module
                queue.append(other)
    raise AssertionError(f"{sorted(circle)} is not a circle")


def test_no_import_circles():
    graph = import_graph()
    assert "queue_app.engine.sql" in graph and "jobsite.settings" in graph
    assert [chain(graph, circle) for circle in import_circles(graph)] == []


def test_the_circle_finder_counts_function_level_imports():
    """apps.py imports the registry only inside AppConfig.ready(); a circle closed that way is still found."""
    modules = all_modules()
    assert "queue_app.registry" in module_imports(APP / "apps.py", modules)
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [frozenset({"a", "b", "c"})]
    assert chain(graph, frozenset({"a", "b", "c"})) == "a -> b -> c -> a"


def test_the_models_import_nothing_of_the_app_but_other_models():
    """queue_app.models registers the models of the app's packages by importing their models modules, and those
    (like the concept modules of the models package) import only Django, each other and the app's settings
    (`queue_app.conf`, which imports only Django): never up into the packages' logic (workflows, Spark scripts),
    which import the models."""
    graph = import_graph()
    models = {
        name
        for name in graph
        if name.startswith("queue_app.models") or (name.startswith("queue_app.") and name.endswith(".models"))
    }
    assert {"queue_app.models.queue", "queue_app.spark.models", "queue_app.probes.models"} <= models
    allowed = models | {"queue_app.conf"}
    assert {name: sorted(graph[name] - allowed) for name in sorted(models) if graph[name] - allowed} == {}


# The datasets layer is an app of its own (queue_app.datasets, issue 45), with its models (label jobsite_datasets);
# the core reaches it only through the hooks it publishes (queue_app/hooks.py): no edge allowed.
DATASETS = "queue_app.datasets"
CORE_TO_DATASETS_ALLOWED: dict[str, set[str]] = {}
# What Spark and workflows (packages of the core until they are apps of their own) still import of the datasets,
# edge by edge: nothing. A Spark run reaches the datasets through the hooks it publishes (spark/hooks.py), and a
# job's, script's or workflow's declared datasets are the core's vocabulary (queue_app/dataset_refs.py). Kept as
# the place a cut not yet made would be named: this list may only shrink (a new edge fails).
NOT_YET_CUT: dict[str, set[str]] = {}


def core_imports_of_datasets() -> dict[str, set[str]]:
    """{core module: the datasets modules it imports}, counting function-level imports and `from pkg import x`
    of the package itself."""
    graph = import_graph()
    return {
        name: found
        for name in graph
        if name.startswith("queue_app")
        and name != DATASETS
        and not name.startswith(DATASETS + ".")
        and (found := {m for m in graph[name] if m == DATASETS or m.startswith(DATASETS + ".")})
    }


def test_the_core_imports_nothing_of_the_datasets_app():
    found = core_imports_of_datasets()
    assert {name: sorted(mods) for name, mods in found.items() if name not in NOT_YET_CUT} == {
        name: sorted(mods) for name, mods in CORE_TO_DATASETS_ALLOWED.items()
    }
    assert {name: sorted(found.get(name, ())) for name in NOT_YET_CUT} == {
        name: sorted(mods) for name, mods in NOT_YET_CUT.items()
    }


# The layers are apps of their own (issue 45): Spark runs, workflows, datasets, webhooks, each with its models (its
# own app label; the tables keep their names). The core reaches them only through the hooks it publishes
# (queue_app/hooks.py, queue_app/events.py): no arrow from the core into a layer. A layer imports only the layers
# its AppConfig requires, and the webhooks the workflows only when that app is installed (webhooks/apps.py).
LAYERS = {
    "queue_app.spark": set(),
    "queue_app.workflows": {"queue_app.spark"},
    "queue_app.datasets": {"queue_app.spark", "queue_app.workflows"},
    "queue_app.webhooks": {"queue_app.workflows"},
}
OPTIONAL = {"queue_app.webhooks": {"queue_app.workflows"}}


def layer_of(module: str) -> str | None:
    return next((app for app in LAYERS if module == app or module.startswith(app + ".")), None)


def core_arrows_into_layers(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """{core module: the layer modules it imports}: every arrow of the drawing running from the core up into a
    layer (function-level imports count)."""
    found = {
        name: sorted(m for m in graph[name] if layer_of(m))
        for name in graph
        if name.startswith("queue_app") and not layer_of(name)
    }
    return {name: mods for name, mods in found.items() if mods}


def test_the_core_imports_no_layer_app():
    graph = import_graph()
    assert core_arrows_into_layers(graph) == {}
    assert "queue_app.events" in graph["queue_app.services"]  # the core publishes its events through the hook
    assert "queue_app.hooks" in graph["queue_app.services"]  # and cancels a layer's rows through one
    from queue_app import hooks
    from queue_app.spark.cancel import cancel_runs_of_items

    assert list(hooks.cancel_requested) == [cancel_runs_of_items]  # the Spark app's ready() registered it


def test_the_arrow_counter_sees_an_arrow_into_a_layer():
    """The check above is only as good as this: a core module importing a layer's models is one arrow."""
    graph = {"queue_app.models": {"queue_app.spark.models", "queue_app.models.queue"}, "queue_app.spark.models": set()}
    assert core_arrows_into_layers(graph) == {"queue_app.models": ["queue_app.spark.models"]}


def test_the_core_models_register_no_layer_model():
    """The core app's models are its own and the probes'; each layer's are its app's, under its label."""
    from django.apps import apps

    core = {model._meta.app_label for model in apps.get_app_config("queue_app").get_models()}
    assert core == {"queue_app"}
    modules = {model.__module__ for model in apps.get_app_config("queue_app").get_models()}
    assert not {m for m in modules if layer_of(m)}, modules
    for app in LAYERS:
        config = apps.get_app_config(app.replace("queue_app.", "jobsite_"))
        assert config.models_module is not None and config.models_module.__name__ == f"{app}.models"
        assert {model.__module__ for model in config.get_models()} == {f"{app}.models"}


def test_a_layer_imports_only_the_layers_it_requires():
    from django.apps import apps

    graph = import_graph()
    used = {app: set() for app in LAYERS}
    for name, imported in graph.items():
        if (app := layer_of(name)) is not None:
            used[app] |= {other for m in imported if (other := layer_of(m)) not in (None, app)}
    assert used == LAYERS
    for app, others in LAYERS.items():  # what each imports is what its AppConfig declares (and checks: E100)
        required = set(apps.get_app_config(app.replace("queue_app.", "jobsite_")).requires)
        assert required - {"queue_app"} == others - OPTIONAL.get(app, set()), app


def test_the_datasets_check_counts_function_level_imports():
    """The check above sees imports inside functions (execute.py's `from ..datasets.producers import
    record_produced` inside _record_produced was one): the datasets' maintenance units import their modules only
    when they run, and the graph has those edges; execute.py now reaches the layer through the hooks."""
    graph = import_graph()
    assert {"queue_app.datasets.stale", "queue_app.datasets.watches"} <= graph["queue_app.datasets.maintenance"]
    assert "queue_app.hooks" in graph["queue_app.worker.execute"]


# What the core's text may not name of a layer (issue 45): a layer's admin URL (its app label's `admin:jobsite_...`
# name, `/admin/jobsite_...` path), a layer model's CSS class on the admin's pages (`.model-sparkrun`), a column
# only a layer's list shows (`.field-webhook_id_short`). The layer's own module or template says it: its charts
# (spark/admin/charts.py), its list's style (admin/jobsite_spark/change_list.html).
LAYER_URL_NAMES = ("admin:jobsite_", "/admin/jobsite_")


def core_texts() -> dict[str, str]:
    """{path: text} of every core module (migrations aside) and every core template (queue_app/templates)."""
    paths = [path for name, path in product_modules().items() if not layer_of(name)]
    paths += sorted((APP / "templates").rglob("*.html"))
    return {str(path.relative_to(APP.parent)): path.read_text() for path in paths}


def layer_css_names() -> set[str]:
    """The CSS classes the admin puts on a layer model's list: `.model-<model>` (the body's) and `.field-<column>`,
    `.column-<column>` of a column only a layer's list has."""
    from django.apps import apps
    from django.contrib import admin

    def columns(app_labels: set[str]) -> set[str]:
        return {
            column
            for model, model_admin in admin.site._registry.items()
            if model._meta.app_label in app_labels
            for column in model_admin.list_display
            if isinstance(column, str)
        }

    labels = {app.replace("queue_app.", "jobsite_") for app in LAYERS}
    models = {
        f".model-{model._meta.model_name}" for label in labels for model in apps.get_app_config(label).get_models()
    }
    only_layers = columns(labels) - columns({"queue_app"})
    return models | {f".{kind}-{column}" for column in only_layers for kind in ("field", "column")}


def layer_names_in(texts: dict[str, str], css: set[str]) -> dict[str, list[str]]:
    found = {
        path: sorted({name for name in LAYER_URL_NAMES if name in text} | {name for name in css if name in text})
        for path, text in texts.items()
    }
    return {path: names for path, names in found.items() if names}


def test_the_core_names_no_layer_url_or_css_class():
    texts, css = core_texts(), layer_css_names()
    assert "queue_app/admin/charts.py" in texts and "queue_app/templates/admin/queue_app/change_list.html" in texts
    assert {".model-sparkrun", ".model-workflow", ".field-webhook_id_short"} <= css
    assert ".field-payload_short" not in css  # the core's items list has it
    assert layer_names_in(texts, css) == {}


def test_the_layer_name_finder_sees_a_url_and_a_class():
    """The check above is only as good as this: a layer's admin URL or a layer model's class is found."""
    texts = {
        "a.py": 'reverse("admin:jobsite_spark_sparkrun_change")',
        "b.html": ".model-sparkrun #result_list .column-trigger { display: none; }",
        "c.html": ".model-reservation #result_list .column-worker { display: none; }",
    }
    assert layer_names_in(texts, {".model-sparkrun"}) == {"a.py": ["admin:jobsite_"], "b.html": [".model-sparkrun"]}
