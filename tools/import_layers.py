"""Import-graph figures of the resdecay package: depth of the longest import chain, imports that go
up the layer table (or round a cycle), and imports inside functions.

Usage: python tools/import_layers.py src/resdecay [--old]
(--old maps the flat pre-reorganisation modules onto the layers they moved to, to compare.)
"""
import ast
import functools
import sys
from functools import lru_cache
from pathlib import Path

# folder (or root module) -> layer; a module may import only from layers below its own or its own folder
LAYERS = {"_version": 0, "errors": 0, "io": 0, "schedule": 0, "yaml_io": 0, "safe_pickle": 0, "nn": 1, "diffusion": 1, "models": 2, "data": 2, "stream": 3, "train": 3,
          "eval": 4, "viz": 5, "commands": 6, "api": 6, "interop": 6, "cli": 7, "facade": 8}
OLD = {"blocks": "nn", "decayify": "nn", "fashion_mnist_m": "data", "latents": "data", "config": "train",
       "checkpoint": "train", "distributed": "train", "runlog": "train", "train": "train", "plots": "viz",
       "eval.figures": "viz", "eval.fid_cli": "commands", "demo": "commands", "demo_diffusion": "commands",
       "finetune": "commands", "supervised": "commands", "ablate": "commands", "sample": "commands",
       "report": "commands", "cli": "cli", "cli_diffusion": "cli"}

root, old = Path(sys.argv[1]).resolve(), "--old" in sys.argv
pkg = root.name
mods = {}
for f in root.rglob("*.py"):
    parts = list(f.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    mods[".".join(parts)] = f


def folder(mod: str) -> str | None:
    if mod == pkg:
        return "facade"
    rel = mod[len(pkg) + 1:]
    if old:
        for key in sorted(OLD, key=len, reverse=True):
            if rel == key or rel.startswith(key + "."):
                return OLD[key]
    top = rel.split(".")[0]
    return top if top in LAYERS else None  # the package root (__init__, __main__) is the facade on top


def resolve(cur: str, is_pkg: bool, level: int, name: str) -> str:
    if level == 0:
        return name
    base = cur.split(".") if is_pkg else cur.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


edges, top_edges, in_function = {m: set() for m in mods}, {m: set() for m in mods}, 0
for m, f in mods.items():
    tree = ast.parse(f.read_text())
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             # the facade's PEP 562 __getattr__ loads the notebook API on first use; that lazy import is the point
             and not (m == pkg and n.name == "__getattr__")]
    inner = {id(n) for fn in funcs for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve(m, f.name == "__init__.py", node.level, node.module or "")
            # `from pkg import sub` reaches the submodule; `from pkg import name` reaches pkg itself
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        else:
            continue
        hit = False
        for t in targets:
            while t and t not in mods:
                t = t.rpartition(".")[0]
            # the facade (the package root) sits on top of every layer: a module importing it reaches up
            if t and t != m and (t == pkg or not m.startswith(t + ".")):
                edges[m].add(t)
                if id(node) not in inner:
                    top_edges[m].add(t)
                hit = True
        in_function += hit and id(node) in inner

up = [(a, b) for a in edges for b in edges[a]
      if folder(a) and folder(b) and folder(a) != folder(b) and LAYERS[folder(b)] > LAYERS[folder(a)]]
sys.setrecursionlimit(10000)


@lru_cache(None)
def reach(m: str) -> frozenset:
    out = set()
    stack = list(edges[m])
    while stack:
        n = stack.pop()
        if n not in out:
            out.add(n)
            stack.extend(edges[n])
    return frozenset(out)


circular = [(a, b) for a in edges for b in edges[a] if a in reach(b)]


def depth(m: str, graph: dict, seen: frozenset = frozenset()) -> int:
    """Modules on the longest import chain from m (a cycle is not walked twice). Without a cycle the longest
    chain from each module is found once and reused (the same number as trying every path, in one pass)."""
    if not circular:
        return _dag_depth(m, id(graph))
    return 1 + max((depth(n, graph, seen | {m}) for n in graph[m] if n not in seen and n != m), default=0)


_GRAPHS: dict = {}


@functools.cache
def _dag_depth(m: str, graph_id: int) -> int:
    graph = _GRAPHS[graph_id]
    return 1 + max((_dag_depth(n, graph_id) for n in graph[m] if n != m), default=0)


_GRAPHS.update({id(edges): edges, id(top_edges): top_edges})
print(f"modules {len(mods)}")
for name, graph in (("all imports", edges), ("module-level imports", top_edges)):
    deepest = max(mods, key=lambda m: depth(m, graph))
    print(f"import_depth ({name}) {depth(deepest, graph)} (from {deepest})")
print(f"upward_imports {len(up)} {sorted(up)}")
print(f"circular_imports {len(circular)} {sorted(circular)}")
print(f"imports_inside_functions {in_function}")


def chain(m: str, graph: dict, seen: frozenset = frozenset()) -> list[str]:
    nxt = [n for n in graph[m] if n not in seen and n != m]
    return [m] + (max((chain(n, graph, seen | {m}) for n in nxt), key=len) if nxt else [])


if "--chain" in sys.argv:
    print(" -> ".join(chain(max(mods, key=lambda m: depth(m, edges)), edges)))
