"""Tasks only the tests need (handlers that crash their process, overrun their hard timeout, return
non-JSON...). Workers started by the tests load them with `run_worker --import tests.tasks.worker_tasks`."""

import ctypes
import os
import threading
import time

from django.db import transaction

from queue_app import engine
from queue_app.probes.tasks import _probe
from queue_app.registry import Context, Delivery, Retry, Settled, job


class Flaky(Exception):
    pass


class Unfixable(Exception):
    pass


@job("tests.sleepy", hard_timeout=1.0, retry=Retry(times=2, delay=0))
def sleepy(payload: dict, ctx: Context) -> None:
    time.sleep(payload.get("seconds", 30))


@job("tests.sleepy_once", hard_timeout=5.0, retry=Retry(times=1))
def sleepy_once(payload: dict, ctx: Context) -> None:
    """tests.sleepy with one attempt and 5 s to its hard timeout: room for a test to set up what the timeout
    must come after (a slow machine took more than 1 s)."""
    time.sleep(payload.get("seconds", 30))


@job("tests.stuck_transactional", delivery=Delivery.TRANSACTIONAL, hard_timeout=1.0, retry=Retry(times=3, delay=0))
def stuck_transactional(payload: dict, ctx: Context) -> None:
    """Logs its run, applies its effect inside its transaction (the item's row locked), and on its first attempt
    never returns in time."""
    _probe({}, ctx)
    if ctx.attempt == 1:
        time.sleep(payload.get("seconds", 600))


GATE = threading.Event()  # in-process tests (thread pool) hold tests.gated handlers until they set it


@job("tests.gated", hard_timeout=60.0)
def gated(payload: dict, ctx: Context) -> bool:
    return GATE.wait(timeout=payload.get("seconds", 30))


@job("tests.crash", retry=Retry(times=1))
def crash(payload: dict, ctx: Context) -> None:
    how = payload["how"]
    if how == "exit":
        os._exit(3)
    if how == "segfault":
        ctypes.string_at(0)
    if how == "system_exit":
        raise SystemExit(4)
    if how == "keyboard_interrupt":
        raise KeyboardInterrupt("raised by the handler")
    raise ValueError(f"unknown crash {how!r}")


@job("tests.flaky", retry=Retry(times=3, delay=0))
def flaky(payload: dict, ctx: Context) -> dict:
    if ctx.attempt < payload.get("succeed_on", 3):
        raise Flaky(f"attempt {ctx.attempt} fails")
    return {"attempt": ctx.attempt}


@job("tests.unfixable", retry=Retry(times=5, delay=0, ignore=(Unfixable,)))
def unfixable(payload: dict, ctx: Context) -> None:
    raise Unfixable("retrying cannot help")


@job("tests.not_json", retry=Retry(times=1))
def not_json(payload: dict, ctx: Context) -> set:
    return {1, 2}


@job("tests.bad_result", retry=Retry(times=1))
def bad_result(payload: dict, ctx: Context) -> object:
    """Returns what the payload names, none of which the queue can store as a result."""
    kind = payload["kind"]
    if kind == "object":
        return object()
    if kind == "nan":
        return {"ratio": float("nan")}
    if kind == "deep":
        value: list = []
        for _ in range(200):
            value = [value]
        return value
    if kind == "huge":
        return "x" * (payload["bytes"] + 1)
    if kind == "nul":
        return {"s": "a\x00b"}
    raise ValueError(f"unknown kind {kind!r}")


@job("tests.extends", hard_timeout=10.0)
def extends(payload: dict, ctx: Context) -> str:
    return ctx.extend_lease(payload["seconds"]).isoformat()


@job("tests.nasty_error", retry=Retry(times=1))
def nasty_error(payload: dict, ctx: Context) -> None:
    raise ValueError("NUL \x00 and a lone surrogate \udcff" + "x" * 10_000)


@job("tests.long_lease", hard_timeout=600.0, lease_timeout=700.0)
def long_lease(payload, ctx):
    """Holds its item for a long time under a long lease (like a Spark run)."""
    time.sleep(payload.get("seconds", 300))


@job("tests.retry_soon", retry=Retry(times=2, delay=0.4))
def retry_soon(payload: dict, ctx: Context) -> dict:
    """Fails its first attempt; the retry is due 0.4 s later."""
    if ctx.attempt == 1:
        raise Flaky("the first attempt fails")
    return {"attempt": ctx.attempt}


# A probe (logs each run in ExecutionLog) with a short hard timeout, so its lease can be as short as 3 s.
quick_probe = job("tests.quick_probe", hard_timeout=1.0)(_probe)


@job("tests.settles_itself", retry=Retry(times=3, delay=0))
def settles_itself(payload: dict, ctx: Context) -> Settled:
    """Settles its own item in the transaction of its work, as a Spark run's end does (registry.Settled)."""
    with transaction.atomic():
        assert engine.lock_reserved(ctx)
        if payload.get("fail"):
            return Settled(None, engine.fail(ctx, "Boom: asked to", retry_in=30), "Boom: asked to", 30)
        engine.complete(ctx, {"ok": True})
        return Settled({"ok": True})
