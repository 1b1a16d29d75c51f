"""One HTTP attempt of a delivery: Standard Webhooks headers signed with the `standardwebhooks` library, a POST
pinned to the address targets.resolve() checked, connect/read timeouts, redirects never followed, and at most
RESPONSE_CHARS of the response kept. Secrets never leave this module except inside the signature header.
"""

import secrets
import threading
import time
from base64 import b64encode
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NamedTuple

from standardwebhooks.webhooks import Webhook

from ..conf import queue_settings
from .targets import RefusedTarget, Target, resolve

if TYPE_CHECKING:
    import httpx

RESPONSE_BYTES = 2048
RESPONSE_CHARS = 2000
USER_AGENT = "jobsite-webhooks/1"
_CLIENTS_PER_THREAD = 32

_local = threading.local()


class AttemptResult(NamedTuple):
    status_code: int | None
    latency_ms: float | None
    response_body: str
    error: str

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def new_secret() -> str:
    """A Standard Webhooks secret: `whsec_` + base64 of 32 random bytes."""
    return "whsec_" + b64encode(secrets.token_bytes(32)).decode()


def signature(secrets_: list[str], webhook_id: str, at: datetime, body: str) -> str:
    """The webhook-signature header: one `v1,<base64>` per secret, space separated (rotation signs with both)."""
    return " ".join(Webhook(secret).sign(webhook_id, at, body) for secret in secrets_)


def headers(secrets_: list[str], webhook_id: str, body: str, at: datetime | None = None) -> dict[str, str]:
    at = (at or datetime.now(UTC)).replace(microsecond=0)
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature(secrets_, webhook_id, at, body),
    }


def _client(hostname: str) -> "httpx.Client":
    """This thread's client for `hostname`. One per host name: connections are pooled by address, and a TLS
    connection opened for one name (its SNI and certificate) must never carry a request for another."""
    clients = getattr(_local, "clients", None)
    if clients is None or len(clients) > _CLIENTS_PER_THREAD:
        for client in (clients or {}).values():
            client.close()
        clients = _local.clients = {}
    client = clients.get(hostname)
    if client is None:
        import httpx

        timeout = httpx.Timeout(
            connect=queue_settings.WEBHOOKS_CONNECT_TIMEOUT,
            read=queue_settings.WEBHOOKS_READ_TIMEOUT,
            write=queue_settings.WEBHOOKS_READ_TIMEOUT,
            pool=queue_settings.WEBHOOKS_CONNECT_TIMEOUT,
        )
        # trust_env=False: an HTTP(S)_PROXY in the environment would make the proxy resolve the name, unchecked.
        client = clients[hostname] = httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False)
    return client


def _pinned(target: Target) -> tuple[str, str]:
    """(URL naming the checked address, Host header) for `target`."""
    address = f"[{target.address}]" if ":" in target.address else target.address
    default_port = 443 if target.url.scheme == "https" else 80
    netloc = address if target.port == default_port else f"{address}:{target.port}"
    host = target.hostname if target.port == default_port else f"{target.hostname}:{target.port}"
    if ":" in target.hostname:  # an IPv6 literal as the host
        host = f"[{target.hostname}]" + ("" if target.port == default_port else f":{target.port}")
    return target.url._replace(netloc=netloc).geturl(), host


def _describe(exc: "httpx.HTTPError") -> str:
    import httpx

    kind = {
        httpx.ConnectTimeout: "connect timeout",
        httpx.ReadTimeout: "read timeout",
        httpx.WriteTimeout: "write timeout",
        httpx.PoolTimeout: "pool timeout",
        httpx.ConnectError: "connection failed",
    }.get(type(exc), type(exc).__name__)
    return f"{kind}: {exc}" if str(exc) else kind


def post(url: str, body: str, request_headers: dict[str, str]) -> AttemptResult:
    """POST `body` to `url` once. Never raises for what the far side does: the result says what happened."""
    import httpx  # the webhooks extra: imported by the first delivery, not by every process that loads the app

    try:
        target = resolve(url)
    except RefusedTarget as exc:
        return AttemptResult(None, None, "", str(exc))
    pinned_url, host = _pinned(target)
    extensions = {"sni_hostname": target.hostname} if target.url.scheme == "https" else {}
    started = time.perf_counter()
    try:
        with _client(target.hostname).stream(
            "POST",
            pinned_url,
            content=body.encode(),
            headers={**request_headers, "host": host},
            extensions=extensions,
        ) as response:
            kept = bytearray()
            for chunk in response.iter_raw():
                kept += chunk
                if len(kept) >= RESPONSE_BYTES:
                    break
            latency = (time.perf_counter() - started) * 1000
            text = kept[:RESPONSE_BYTES].decode("utf-8", "replace").replace("\x00", "")[:RESPONSE_CHARS]
            error = ""
            if response.is_redirect:
                error = f"redirect to {response.headers.get('location', '?')[:300]} not followed"
            elif not response.is_success:
                error = f"HTTP {response.status_code}"
            return AttemptResult(response.status_code, latency, text, error)
    except httpx.HTTPError as exc:
        return AttemptResult(None, (time.perf_counter() - started) * 1000, "", _describe(exc)[:2000])
