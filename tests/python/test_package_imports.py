"""The package's modules import one another without a circle (issue 57, item
4: one owner per concept). Every import of a sibling counts, also one made
inside a function (a circle hidden by a lazy import is still two modules that
each need the other)."""
import ast
import os

from tsar_testutil import REPO

PACKAGE = os.path.join(REPO, "python", "tsar")


def _siblings(path):
    """The package modules that the module at ``path`` imports."""
    out = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(a.name for a in node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            out.update(n.split(".")[1] for n in names if n and n.startswith("tsar."))
    return out


def _graph():
    modules = {f[:-3] for f in os.listdir(PACKAGE) if f.endswith(".py")}
    return {m: sorted(_siblings(os.path.join(PACKAGE, m + ".py")) & (modules - {m}))
            for m in modules}


def _circle(graph):
    """A circle of imports as a list of modules, or None."""
    state = {}  # module -> 1 while on the path, 2 when done

    def visit(m, path):
        state[m] = 1
        for n in graph[m]:
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n, path + [n])
                if found:
                    return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def test_the_package_has_no_import_circle():
    graph = _graph()
    # The check sees what it must: the bind imports its portable half.
    assert "_portable_bind" in graph["_bind"] and "_module_state" in graph["_portable_bind"]
    circle = _circle(graph)
    assert circle is None, " -> ".join(circle)


def test_a_circle_is_found():
    assert _circle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert _circle({"a": ["b"], "b": [], "c": ["a"]}) is None
