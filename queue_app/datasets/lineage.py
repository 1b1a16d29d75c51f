"""Lineage: the datasets and the jobs between them, from the jobs' declarations (issue 38).

A job that consumes dataset A and produces dataset B is an edge A -> job -> B. The jobs are the Spark jobs and
registered scripts with `produces=`/`consumes=` (code, settings and stored scripts): a workflow's Spark step
runs one of them, so its step reads and writes what its job declares and adds no edge of its own. The caller
passes the declarations in (`spark_runs.users()`: the jobs build on datasets, not the other way round).

    graph = LineageGraph(users())
    seen = graph.neighbourhood("daily_revenue", depth=3)
    seen.upstream, seen.downstream, seen.jobs        # names, sorted
    seen.edges                                       # (from, to) pairs of node keys "dataset:X" / "job:Y"
    seen.labels                                      # {edge: "window to weekly"}: a consumer's mapping (mappings.py)

Upstream of D: the datasets its producers consume, and theirs, up to `depth` dataset hops (None: all the way).
Downstream: the datasets its consumers produce, and so on. `jobs`: every job crossed on the way (D's producers
and consumers included). A cycle (a job reading and writing one dataset, or a loop of jobs) is walked once.
Plain Python: no database, no Django.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

MAX_NODES = 5_000  # a neighbourhood is cut here (the admin draws it; `truncated` says so)


def dataset_key(name: str) -> str:
    return f"dataset:{name}"


def job_key(name: str) -> str:
    return f"job:{name}"


@dataclass
class Neighbourhood:
    dataset: str
    upstream: list[str] = field(default_factory=list)
    downstream: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    edges: set[tuple[str, str]] = field(default_factory=set)
    labels: dict[tuple[str, str], str] = field(default_factory=dict)
    truncated: bool = False

    def as_json(self) -> dict[str, object]:
        """What `dataset lineage --json` prints."""
        return {"dataset": self.dataset, "upstream": self.upstream, "downstream": self.downstream, "jobs": self.jobs}

    @property
    def datasets(self) -> list[str]:
        return [self.dataset, *self.upstream, *self.downstream]


class LineageGraph:
    """The bipartite graph of datasets and jobs, from {dataset: {"producers": [jobs], "consumers": [jobs]}}."""

    def __init__(
        self, users: Mapping[str, Mapping[str, Iterable[str]]], labels: Mapping[tuple[str, str], str] | None = None
    ) -> None:
        self.labels = dict(labels or {})  # (dataset, job) -> the mapping the job reads the dataset through
        self.producers: dict[str, set[str]] = defaultdict(set)  # dataset -> jobs writing it
        self.consumers: dict[str, set[str]] = defaultdict(set)  # dataset -> jobs reading it
        self.produces: dict[str, set[str]] = defaultdict(set)  # job -> datasets it writes
        self.consumes: dict[str, set[str]] = defaultdict(set)  # job -> datasets it reads
        for name, jobs in users.items():
            for job in jobs.get("producers", ()):
                self.producers[name].add(job)
                self.produces[job].add(name)
            for job in jobs.get("consumers", ()):
                self.consumers[name].add(job)
                self.consumes[job].add(name)

    def neighbourhood(self, name: str, depth: int | None = None, *, max_nodes: int = MAX_NODES) -> Neighbourhood:
        """`name`'s upstream and downstream datasets within `depth` dataset hops (None: unbounded) and the jobs
        between them; at most `max_nodes` nodes (then `truncated`)."""
        seen = Neighbourhood(name)
        nodes = {dataset_key(name)}
        found: dict[str, set[str]] = {"up": set(), "down": set()}
        for direction in ("up", "down"):
            jobs_of, datasets_of = (
                (self.producers, self.consumes) if direction == "up" else (self.consumers, self.produces)
            )
            visited = {name}
            frontier: deque[tuple[str, int]] = deque([(name, 0)])
            while frontier:
                current, hops = frontier.popleft()
                if depth is not None and hops >= depth:
                    continue
                for job in sorted(jobs_of.get(current, ())):
                    if not self._admit(seen, nodes, job_key(job), max_nodes):
                        break
                    edge = _edge(direction, dataset_key(current), job_key(job))
                    seen.edges.add(edge)
                    if direction == "down" and (label := self.labels.get((current, job))):
                        seen.labels[edge] = label
                    for nxt in sorted(datasets_of.get(job, ())):
                        if not self._admit(seen, nodes, dataset_key(nxt), max_nodes):
                            break
                        edge = _edge(direction, job_key(job), dataset_key(nxt))
                        seen.edges.add(edge)
                        if direction == "up" and (label := self.labels.get((nxt, job))):
                            seen.labels[edge] = label
                        if nxt not in visited:
                            visited.add(nxt)
                            found[direction].add(nxt)
                            frontier.append((nxt, hops + 1))
        seen.upstream = sorted(found["up"] - {name})
        seen.downstream = sorted(found["down"] - {name})
        seen.jobs = sorted(key.removeprefix("job:") for key in nodes if key.startswith("job:"))
        return seen

    @staticmethod
    def _admit(seen: Neighbourhood, nodes: set[str], key: str, max_nodes: int) -> bool:
        if key in nodes:
            return True
        if len(nodes) >= max_nodes:
            seen.truncated = True
            return False
        nodes.add(key)
        return True


def _edge(direction: str, near: str, far: str) -> tuple[str, str]:
    """The edge between a node nearer the dataset and one farther, pointing the way data flows."""
    return (far, near) if direction == "up" else (near, far)
