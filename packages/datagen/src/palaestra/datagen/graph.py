"""The API graph G = (T, R, P): tools, prerequisite edges, output-to-input mappings, failure statistics.

Nodes are ``env.tool``. Two kinds of edges:

- ``mapping``: a response key of A can feed a parameter of B (mined from
  the schemas by name, or named in B's parameter description); observed
  flows during sampling add counts;
- ``prerequisite``: B fails from the initial state but succeeds once A has
  been called (found by *executing*: `probe_prerequisites` tries B on a fresh
  environment, then after each candidate A, greedily keeping an A that
  changes B's error, up to three deep: ``startEngine`` needs ``lockDoors``
  and ``pressBrakePedal``).

Per tool: calls, failures (from executions) and student failures (from the
closed loop); ``weight`` steers the next round's targets toward tools the
student fails on. `save` writes ``graph.json`` and ``graph.png``; the jobs log ``graph.json`` and the
`figure` (``Tracker.log_figure``) to MLflow.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import networkx as nx

from palaestra.datagen.argfill import key_described, names_match, propose_arguments, tokens
from palaestra.datagen.envs import ApiEnvSpec, ToolEnv
from palaestra.datagen.schema import parameters, response_keys


def node(env: str, tool: str) -> str:
    return f"{env}.{tool}"


class ApiGraph:
    """A networkx DiGraph over the tools of several environments."""

    def __init__(self, g: nx.DiGraph | None = None, version: int = 0):
        self.g = g if g is not None else nx.DiGraph()
        self.version = version

    # -- mining ----------------------------------------------------------
    def add_env(self, spec: ApiEnvSpec, probe: bool = True, seed: int = 0) -> None:
        for doc in spec.docs:
            self.g.add_node(
                node(spec.name, doc["name"]),
                env=spec.name,
                tool=doc["name"],
                weight=1.0,
                calls=0,
                failures=0,
                student_tries=0,
                student_failures=0,
                prerequisites=[],
            )
        for a in spec.docs:
            keys = response_keys(a)
            for b in spec.docs:
                if a["name"] == b["name"]:
                    continue
                pairs = [
                    (k, p)
                    for p, pspec in parameters(b).items()
                    for k in keys
                    if names_match(p, k) or key_described(k, tokens(pspec.get("description", "") or ""))
                ]
                if pairs:
                    self._edge(spec.name, a["name"], b["name"], "mapping", mappings=pairs)
        if probe:
            probe_prerequisites(self, spec, seed)

    def _edge(self, env: str, a: str, b: str, kind: str, **attrs) -> None:
        u, v = node(env, a), node(env, b)
        data = self.g.get_edge_data(u, v) or {
            "kinds": [],
            "mappings": [],
            "observed": 0,
            "weight": 1.0,
            "student_failures": 0,
        }
        if kind not in data["kinds"]:
            data["kinds"].append(kind)
        for m in attrs.get("mappings", []):
            if list(m) not in data["mappings"]:
                data["mappings"].append(list(m))
        self.g.add_edge(u, v, **data)

    # -- queries ---------------------------------------------------------
    def tools(self, env: str) -> list[str]:
        return [d["tool"] for _, d in self.g.nodes(data=True) if d["env"] == env]

    def prerequisites(self, env: str, tool: str) -> list[str]:
        return list(self.g.nodes[node(env, tool)]["prerequisites"])

    def distance(self, env: str, a: str, b: str) -> float:
        """Hops from tool a toward tool b (directed first, else undirected; inf if unconnected)."""
        u, v = node(env, a), node(env, b)
        try:
            return nx.shortest_path_length(self.g, u, v)
        except nx.NetworkXNoPath:
            try:
                return nx.shortest_path_length(self.g.to_undirected(as_view=True), u, v) + 0.5
            except nx.NetworkXNoPath:
                return float("inf")

    def weight(self, env: str, tool: str) -> float:
        return float(self.g.nodes[node(env, tool)]["weight"])

    def feeders(self, env: str, tool: str) -> set[str]:
        """Tools with an output-to-input mapping into `tool` (their output can feed one of its parameters)."""
        return {
            u.split(".", 1)[1] for u, _, d in self.g.in_edges(node(env, tool), data=True) if "mapping" in d["kinds"]
        }

    def fed(self, env: str, tool: str) -> bool:
        return bool(self.feeders(env, tool))

    def edge_weight(self, env: str, a: str, b: str) -> float:
        """The weight of edge a -> b (1.0 where there is no edge)."""
        data = self.g.get_edge_data(node(env, a), node(env, b))
        return float(data["weight"]) if data else 1.0

    # -- refinement from executions and evaluation -----------------------
    def record_execution(self, env: str, tool: str, ok: bool) -> None:
        data = self.g.nodes[node(env, tool)]
        data["calls"] += 1
        data["failures"] += 0 if ok else 1

    def record_flow(self, env: str, a: str, key: str, b: str, param: str) -> None:
        self._edge(env, a, b, "mapping", mappings=[(key, param)])
        self.g.edges[node(env, a), node(env, b)]["observed"] += 1

    def record_student(self, env: str, tool: str, failed: bool, previous: str | None = None) -> None:
        data = self.g.nodes[node(env, tool)]
        data["student_tries"] += 1
        data["student_failures"] += int(failed)
        if failed and previous is not None and self.g.has_edge(node(env, previous), node(env, tool)):
            self.g.edges[node(env, previous), node(env, tool)]["student_failures"] += 1

    def update_weights(self, boost: float = 4.0) -> dict[str, float]:
        """weight = 1 + boost * (student failure rate); returns the new weights."""
        for _, d in self.g.nodes(data=True):
            rate = d["student_failures"] / d["student_tries"] if d["student_tries"] else 0.0
            d["weight"] = 1.0 + boost * rate
        for _u, v, d in self.g.edges(data=True):
            tries = self.g.nodes[v]["student_tries"]
            d["weight"] = 1.0 + boost * (d["student_failures"] / tries if tries else 0.0)
        self.version += 1
        return {n: d["weight"] for n, d in self.g.nodes(data=True)}

    def merge_stats(self, stats: dict) -> None:
        """Fold counts returned by workers (`Stats.graph`) into the graph."""
        for name, (calls, failures) in stats.get("calls", {}).items():
            if name in self.g:
                self.g.nodes[name]["calls"] += calls
                self.g.nodes[name]["failures"] += failures
        for env, a, key, b, param in stats.get("flows", []):
            if node(env, a) in self.g and node(env, b) in self.g:
                self.record_flow(env, a, key, b, param)

    # -- persistence -----------------------------------------------------
    def to_dict(self) -> dict:
        return {"version": self.version, "graph": nx.node_link_data(self.g, edges="links")}

    @classmethod
    def from_dict(cls, data: dict) -> ApiGraph:
        return cls(nx.node_link_graph(data["graph"], edges="links"), data.get("version", 0))

    def save(self, directory: str | Path) -> list[Path]:
        """``graph.json`` and ``graph.png`` (tools colored by environment, prerequisite edges dark)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        json_path = directory / "graph.json"
        json_path.write_text(json.dumps(self.to_dict(), default=str))
        return [json_path, self.draw(directory / "graph.png")]

    def draw(self, path: Path) -> Path:
        import matplotlib.pyplot as plt

        fig = self.figure()
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        return path

    def figure(self):
        """The graph as a matplotlib figure (tools colored by environment, prerequisite edges dark)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        envs = sorted({d["env"] for _, d in self.g.nodes(data=True)})
        colors = {e: plt.cm.tab10(i % 10) for i, e in enumerate(envs)}
        pos = {}  # one cluster per environment on a grid, so edges stay readable
        cols = max(1, int(len(envs) ** 0.5 + 0.999))
        for i, e in enumerate(envs):
            sub = self.g.subgraph([n for n, d in self.g.nodes(data=True) if d["env"] == e])
            for n, (x, y) in nx.spring_layout(sub, seed=0, k=1.2).items():
                pos[n] = (x + 3.0 * (i % cols), y - 3.0 * (i // cols))
        fig, ax = plt.subplots(figsize=(16, 12))
        nx.draw_networkx_nodes(
            self.g,
            pos,
            ax=ax,
            node_color=[colors[self.g.nodes[n]["env"]] for n in self.g],
            node_size=[80 * self.g.nodes[n]["weight"] for n in self.g],
        )
        prereq = [(u, v) for u, v, d in self.g.edges(data=True) if "prerequisite" in d["kinds"]]
        mapping = [(u, v) for u, v, d in self.g.edges(data=True) if "prerequisite" not in d["kinds"]]
        nx.draw_networkx_edges(self.g, pos, edgelist=mapping, ax=ax, alpha=0.15, arrowsize=6)
        nx.draw_networkx_edges(self.g, pos, edgelist=prereq, ax=ax, edge_color="black", width=1.5, arrowsize=10)
        nx.draw_networkx_labels(self.g, pos, labels={n: self.g.nodes[n]["tool"] for n in self.g}, font_size=6, ax=ax)
        for e in envs:
            ax.scatter([], [], color=colors[e], label=e)
        ax.legend(loc="upper left", fontsize=8)
        ax.set_title(
            f"API graph v{self.version}: {self.g.number_of_nodes()} tools, "
            f"{len(prereq)} prerequisite / {len(mapping)} mapping edges"
        )
        ax.axis("off")
        return fig


def try_call(env: ToolEnv, tool: str, outputs: list, rng: random.Random, attempts: int = 6, raw_outputs=(), fixed=None):
    """Execute `tool` with up to `attempts` proposed assignments on forks; return (env', execution) or (env, last).
    `fixed`: parameter -> value set in every assignment (a value carried over from an earlier turn)."""
    last = None
    for _ in range(attempts):
        args, _ = propose_arguments(env, tool, outputs, rng, raw_outputs=raw_outputs)
        args.update(fixed or {})
        fork = env.copy()
        result = fork.execute(tool, args)
        if result.ok:
            return fork, result
        last = result
    return env, last


def probe_prerequisites(graph: ApiGraph, spec: ApiEnvSpec, seed: int = 0, max_depth: int = 3) -> None:
    """Find prerequisite edges by execution (see the module docstring)."""
    rng = random.Random(seed)
    base = ToolEnv(spec, 0)
    for target in spec.tool_names:
        _, first = try_call(base, target, [], rng)
        if first.ok:
            continue
        error, prefix_env = first.error, base
        outputs: list = []
        prefix: list[str] = []
        for _depth in range(max_depth):
            ordered = sorted(
                (t for t in spec.tool_names if t != target and t not in prefix),
                key=lambda t: (not graph.g.has_edge(node(spec.name, t), node(spec.name, target)), t),
            )
            progress: tuple | str | None = None
            for candidate in ordered:
                env_c, ex = try_call(prefix_env, candidate, outputs, rng, attempts=3)
                if not ex.ok:
                    continue
                outs = outputs + _pairs(ex.output)
                _, after = try_call(env_c, target, outs, rng)
                if after.ok:
                    prefix.append(candidate)
                    for p in prefix:
                        graph._edge(spec.name, p, target, "prerequisite")
                    graph.g.nodes[node(spec.name, target)]["prerequisites"] = list(prefix)
                    progress = "done"
                    break
                if after.error != error and progress is None:
                    progress = (candidate, env_c, outs, after.error)
            if not isinstance(progress, tuple):
                break
            candidate, prefix_env, outputs, error = progress
            prefix.append(candidate)


def _pairs(output) -> list:
    from palaestra.datagen.argfill import leaves

    return leaves(output, "result")
