"""The figures of a chaos run: a table for people (printed at the end) and a dict for machines (--json-out)."""

from collections import Counter
from dataclasses import asdict
from typing import Any

from .checks import POISON, Check, Expect
from .history import History

DUPLICATES_SHOWN = 40


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def redelivery_delays(h: History) -> dict[str, Any]:
    """How long an item whose lease expired waited to be leased again, from the moment its expiry was noticed
    (the expired reservation's finished_at: the rescue, or the lease that took it over) to its next reservation.
    Seconds: n, p50, p99, max."""
    delays = []
    for reservations in h.res_by_item.values():
        for earlier, later in zip(reservations, reservations[1:], strict=False):
            if earlier.outcome == "expired" and earlier.finished_at is not None:
                delays.append(max(0.0, (later.reserved_at - earlier.finished_at).total_seconds()))
    if not delays:
        return {"n": 0}
    return {
        "n": len(delays),
        "p50": round(_quantile(delays, 0.5), 3),
        "p99": round(_quantile(delays, 0.99), 3),
        "max": round(max(delays), 3),
    }


class Report:
    def __init__(self, run, history: History, expect: Expect, checks: list[Check], elapsed: float) -> None:
        self.run, self.h, self.expect, self.checks, self.elapsed = run, history, expect, checks, elapsed
        self.by_name = {c.name: c for c in checks}

    def _check(self, name: str) -> Check:
        return self.by_name[name]

    def lines(self) -> list[str]:
        run, planted = self.run, self.run.planted
        modes = Counter(self.expect.modes.values())
        fired = run.fired
        kills = [f for f in fired if f.kind == "kill"]
        amo_kills = [f for f in fired if f.kind == "kill_amo"]
        terms = [f for f in fired if f.kind == "sigterm"]
        restarts = [f for f in fired if f.kind == "restart"]
        cuts = [f for f in fired if f.kind == "cut"]
        pools = Counter(p.pool for p in run.fleet.procs)
        dup = self._check("every duplicate explained")
        lost, stuck = self._check("lost 0"), self._check("stuck 0")
        dead = self._check("dead letters = planted poison")
        out = [
            "",
            f"== queue_chaos: seed {run.opts.seed}, {planted.total:,} items, {run.sizes.workers} workers x "
            f"{run.sizes.concurrency} slots, {self.elapsed:.1f}s ==",
            f"items            {planted.total:,}: "
            + ", ".join(f"{m} {n:,}" for m, n in sorted(modes.items()) if m != POISON)
            + f"; poison {modes.get(POISON, 0)}; {sum(map(len, planted.by_key.values())):,} on "
            f"{len(planted.by_key)} ordering keys",
            f"workers          {len(run.fleet.procs)} started ({pools.get('process', 0)} process pool, "
            f"{pools.get('thread', 0)} thread pool), {run.burst_rounds} burst round(s) at the end",
            f"kills (-9)       {len(kills)}: "
            + "; ".join(f"{f.worker_id} pid {f.pid} holding {f.held} at {f.t:.0f}s ({f.progress:.0%})" for f in kills),
            f"kills mid AMO    {len(amo_kills)}: "
            + "; ".join(f"{f.worker_id} running at-most-once items {f.amo_running} at {f.t:.0f}s" for f in amo_kills),
            f"SIGTERMs         {len(terms)}: "
            + "; ".join(
                f"{f.worker_id} at {f.t:.0f}s ({f.progress:.0%}) exit {self._exit(f.worker_id)}" for f in terms
            ),
            f"restarts         {len(restarts)}: "
            + "; ".join(f"at {f.t:.0f}s ({f.progress:.0%}), back in {f.seconds:.1f}s" for f in restarts),
            f"connection cuts  {len(cuts)}: "
            + "; ".join(
                f"at {f.t:.0f}s ({f.progress:.0%}), {f.connections} reset, refused {f.seconds:g}s" for f in cuts
            )
            + f" (proxy: {run.proxy.stats.refused} refused, {run.proxy.stats.upstream_failed} upstream failures)",
            f"runs             {len(self.h.runs):,} handler runs; duplicates {dup.figures['duplicates']} "
            f"({self._explained(dup)})",
        ]
        for d in dup.details[:DUPLICATES_SHOWN]:
            out.append(
                f"  item {d['item']} ({d['mode']}): reservation {d['earlier_reservation']} of {d['earlier_worker']} "
                f"ended {d['earlier_outcome']} -> {d['why']}; ran again under {d['later_reservation']}"
            )
        if len(dup.details) > DUPLICATES_SHOWN:
            out.append(f"  ... {len(dup.details) - DUPLICATES_SHOWN} more in the JSON")
        out += [
            f"lost             {lost.figures['lost']}   (at-most-once casualties: {lost.figures['amo_casualties']})",
            f"stuck            {stuck.figures['stuck']}   (reserved past lease {stuck.figures['reserved_past_lease']})",
            f"dead letters     planted {dead.figures['planted']}, poison dead {dead.figures['poison_dead']}, "
            f"dead items {dead.figures['dead_items']}, unexplained {dead.figures['unexplained']}",
            "re-delivery      after a lease expired, until leased again: " + self._redelivery(),
            "phases           " + ", ".join(f"{k} {v:.1f}s" for k, v in run.phase_times.items()),
            "",
            f"{'CHECK':<40} {'RESULT':<7} FIGURES",
        ]
        for check in self.checks:
            figures = " ".join(f"{k}={v}" for k, v in check.figures.items())
            out.append(f"{check.name:<40} {'PASS' if check.passed else 'FAIL':<7} {figures}")
            out += [f"    - {p}" for p in check.problems]
        passed = sum(c.passed for c in self.checks)
        verdict = "PASS" if passed == len(self.checks) else "FAIL"
        out.append(f"RESULT: {verdict} ({passed}/{len(self.checks)} checks passed)")
        return out

    def _redelivery(self) -> str:
        d = redelivery_delays(self.h)
        if not d["n"]:
            return "no expired lease was leased again"
        return f"p50 {d['p50']:.3f}s, p99 {d['p99']:.3f}s, max {d['max']:.3f}s over {d['n']} re-deliveries"

    def _exit(self, worker_id: str) -> Any:
        return next((p.exit_code for p in self.run.fleet.procs if p.worker_id == worker_id), None)

    @staticmethod
    def _explained(dup: Check) -> str:
        parts = [f"{why} {n}" for why, n in sorted(dup.figures["explained"].items())]
        return ", ".join(parts + [f"unexplained {dup.figures['unexplained']}"])

    def as_dict(self) -> dict:
        run = self.run
        return {
            "seed": run.opts.seed,
            "sizes": asdict(run.sizes),
            "elapsed_seconds": round(self.elapsed, 1),
            "phases": {k: round(v, 1) for k, v in run.phase_times.items()},
            "items": {
                "total": run.planted.total,
                "by_mode": Counter(self.expect.modes.values()),
                "ordered": sum(map(len, run.planted.by_key.values())),
                "keys": len(run.planted.by_key),
            },
            "faults": [asdict(f) for f in run.fired],
            "unfired": [asdict(f) for f in run.unfired],
            "proxy": asdict(run.proxy.stats),
            "workers": [
                {"id": p.worker_id, "pid": p.pid, "pool": p.pool, "burst": p.burst, "fate": p.fate, "exit": p.exit_code}
                for p in run.fleet.procs
            ],
            "runs": len(self.h.runs),
            "redelivery_delay_seconds": redelivery_delays(self.h),
            "duplicates": self._check("every duplicate explained").details,
            "checks": [c.as_dict() for c in self.checks],
            "passed": all(c.passed for c in self.checks),
        }
