"""The include graph of the C sources has no circle: no file reaches itself through its #include "..." lines, and
the layers (each folder of src/ with its subfolders, bench/) include one another in one direction only
(docs/architecture.md, "Layers, bottom up"). Parsed from the sources here, independent of the build."""
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOPS = ("src", "bench")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _graph():
    files = set()
    for top in TOPS:
        for d, _, names in os.walk(os.path.join(ROOT, top)):
            files.update(os.path.relpath(os.path.join(d, n), ROOT) for n in names if n.endswith((".c", ".h")))
    graph = {}
    for f in files:
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            text = fh.read()
        out = set()
        for inc in INCLUDE.findall(text):
            for base in (os.path.dirname(f), "src"):
                p = os.path.normpath(os.path.join(base, inc))
                if p in files:
                    out.add(p)
                    break
        graph[f] = out
    return graph


def _circles(graph):
    """The strongly connected components with more than one node, or a node that includes itself (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
            if len(comp) > 1 or v in graph.get(v, ()):
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _layer(path):
    parts = path.split(os.sep)
    return os.sep.join(parts[:2]) if parts[0] == "src" and len(parts) > 2 else parts[0]


def test_no_file_includes_itself_through_others():
    graph = _graph()
    assert any(graph.values()), "no include found: the parser is broken"
    assert _circles(graph) == []


def test_layers_include_one_way():
    layers = {}
    for f, outs in _graph().items():
        for o in outs:
            if _layer(f) != _layer(o):
                layers.setdefault(_layer(f), set()).add(_layer(o))
    assert "src/runtime" in layers.get("src/kernels", set()), "the parser misses the kernels -> runtime includes"
    assert _circles(layers) == []


def test_the_check_finds_a_circle():
    assert _circles({"a.h": {"b.h"}, "b.h": {"c.h"}, "c.h": {"a.h"}, "d.h": {"a.h"}}) == [["a.h", "b.h", "c.h"]]
    assert _circles({"a.h": {"a.h"}}) == [["a.h"]]
    assert _circles({"a.h": {"b.h"}, "b.h": set()}) == []
