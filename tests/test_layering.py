"""The straight line of dependencies (issue 11), read from the source with ``ast``.

Layers, lowest first: ``eagle.tree`` -> ``eagle.sampling`` -> ``eagle.rules`` (drafting rules)
-> ``eagle.verify`` (verifiers; the plugin ``univer_patch`` sits beside them) -> inference (the
rest of ``eagle``: model, drafting, autotree, the shipped data and its readers, testing) -> head
training (``eagle.train``) -> ``evaluation`` -> ``research`` (the head-training campaign's tools). A
module may import its own layer or lower ones, never a higher one; no import cycles (lazy imports
inside functions count); ``eagle`` never imports ``univer_patch``; inference never imports training
or research, and evaluation never imports research.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("eagle", "univer_patch", "evaluation", "research")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def layer(module: str) -> float:
    if module == "eagle" or module.startswith("eagle.tree") or module == "eagle.plugins":
        return 0
    if module == "eagle.sampling":
        return 1
    if module == "eagle.rules":
        return 2
    if module.startswith("eagle.verify") or module.startswith("univer_patch"):
        return 3
    if module == "eagle.train" or module.startswith("eagle.train."):
        return 5
    if module.startswith("eagle."):
        return 4
    if module.startswith("evaluation"):
        return 6
    if module.startswith("research"):
        return 7
    raise AssertionError(f"module {module} has no layer")


def _resolve(name: str) -> str | None:
    """The project module ``name`` refers to (longest existing prefix), or None if external."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in MODULES:
            return cand
        parts.pop()
    return None


def imports_of(module: str) -> set[str]:
    """Project modules imported anywhere in ``module`` (top level and inside functions)."""
    path = MODULES[module]
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_pkg:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module
            # "from pkg import sub" imports the submodule sub when there is one
            names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix for a in node.names]
        else:
            continue
        for n in names:
            target = _resolve(n)
            if target is not None and target != module:
                out.add(target)
    return out


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_module_has_a_layer():
    for m in MODULES:
        layer(m)


def test_eagle_never_imports_univer_patch():
    bad = sorted((m, t) for m, ts in GRAPH.items() if m.split(".")[0] == "eagle" for t in ts
                 if t.startswith("univer_patch"))
    assert not bad, f"eagle imports its plugin: {bad}"


def test_no_import_from_a_lower_layer_to_a_higher_one():
    bad = sorted((m, t) for m, ts in GRAPH.items() for t in ts if layer(t) > layer(m))
    assert not bad, f"imports against the layering: {bad}"


def test_no_import_cycles():
    index, low, stack, on, sccs = {}, {}, [], set(), []
    counter = [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not sccs, f"import cycles: {sccs}"


#: the inference side: what generates text (engine, drafting, verifiers, the shipped head's files)
INFERENCE = ("eagle.model", "eagle.verify", "eagle.tree", "eagle.data", "eagle.drafting", "eagle.drafters", "eagle.plugins", "eagle.autotree",
             "eagle.rules", "eagle.sampling", "univer_patch")


def _in(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_inference_never_imports_training_or_research():
    inference = [m for m in GRAPH if _in(m, INFERENCE)]
    assert "eagle.autotree" in inference and "eagle.model.default" in inference
    bad = sorted((m, t) for m in inference for t in GRAPH[m] if _in(t, ("eagle.train", "research")))
    assert not bad, f"inference imports training / research code: {bad}"


def test_evaluation_never_imports_research():
    bad = sorted((m, t) for m, ts in GRAPH.items() if _in(m, ("evaluation",)) for t in ts if _in(t, ("research",)))
    assert not bad, f"evaluation imports the research campaign: {bad}"


@pytest.mark.parametrize("module,target", [("eagle.verify.rrsw", "eagle.verify.registry"),
                                           ("univer_patch.univer", "eagle.verify.registry"),
                                           ("eagle.drafting", "eagle.rules"),
                                           ("eagle.autotree", "eagle.data.corpus"),
                                           ("research.heldout", "eagle.train.train")])
def test_the_parser_sees_known_imports(module, target):
    """Control: the graph holds imports known to exist (so an empty graph cannot pass)."""
    assert target in GRAPH[module]


def test_a_planted_cycle_and_upward_import_are_caught(monkeypatch):
    """Negative control: the checks fail on a graph with a cycle and an upward import."""
    monkeypatch.setitem(GRAPH, "eagle.rules", GRAPH["eagle.rules"] | {"eagle.verify.registry"})
    with pytest.raises(AssertionError, match="layering"):
        test_no_import_from_a_lower_layer_to_a_higher_one()
    with pytest.raises(AssertionError, match="cycles"):
        test_no_import_cycles()


def test_a_planted_training_import_in_inference_is_caught(monkeypatch):
    """Negative control: inference importing the corpus builder or training, evaluation importing research."""
    monkeypatch.setitem(GRAPH, "eagle.autotree", GRAPH["eagle.autotree"] | {"research.corpus"})
    with pytest.raises(AssertionError, match="training / research"):
        test_inference_never_imports_training_or_research()
    monkeypatch.setitem(GRAPH, "eagle.autotree", GRAPH["eagle.autotree"] | {"eagle.train.data"})
    with pytest.raises(AssertionError, match="training / research"):
        test_inference_never_imports_training_or_research()
    monkeypatch.setitem(GRAPH, "evaluation.speed", GRAPH["evaluation.speed"] | {"research.paired"})
    with pytest.raises(AssertionError, match="research campaign"):
        test_evaluation_never_imports_research()
