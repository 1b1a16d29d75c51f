"""Where a webhook may go (server-side request forgery): only http(s) URLs without credentials, and only to
public addresses unless JOBSITE_WEBHOOKS_ALLOW_PRIVATE is set.

The check that counts runs at send time on the resolved addresses, and the request is then made to the address
that passed (pinned), so a name that resolves to a public address when checked and to 127.0.0.1 a moment later
(DNS rebinding) cannot steer the request. The form's check is for early, clear errors only.
"""

import ipaddress
import socket
from typing import NamedTuple
from urllib.parse import SplitResult, urlsplit

from ..conf import queue_settings

MAX_URL = 2000


class RefusedTarget(ValueError):
    """The URL or the address it resolves to is not an allowed webhook target."""


class Target(NamedTuple):
    url: SplitResult
    hostname: str  # as written (IDNA-encoded), for the Host header and TLS SNI
    port: int
    address: str  # the checked IP address the request is made to


def parse_url(url: str) -> SplitResult:
    """The URL split, or RefusedTarget saying what is wrong with it."""
    if not isinstance(url, str) or not url.strip():
        raise RefusedTarget("enter a URL")
    if len(url) > MAX_URL:
        raise RefusedTarget(f"the URL is longer than {MAX_URL} characters")
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        raise RefusedTarget("the URL contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise RefusedTarget(f"not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise RefusedTarget(f"only http and https URLs are allowed, not {parts.scheme or 'no scheme'!r}")
    if not parts.hostname:
        raise RefusedTarget("the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise RefusedTarget("credentials in the URL are not allowed (they would be stored and shown in clear)")
    if parts.fragment:
        raise RefusedTarget("a URL fragment is never sent; remove it")
    if port == 0:
        raise RefusedTarget("port 0 is not a valid port")
    return parts


def refusal(address: str) -> str | None:
    """Why `address` is not an allowed target (None: it is public)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address (cloud metadata services live there)"
    if ip.is_unspecified:
        return "the unspecified address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_private:
        return "a private address"
    if not ip.is_global:
        return "not a public address"
    return None


def private_allowed() -> bool:
    return bool(queue_settings.WEBHOOKS_ALLOW_PRIVATE)


def _literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


def check_url(url: str) -> SplitResult:
    """Early check for forms and the CLI: the URL's shape, and its host when that is an IP literal or localhost.
    Names are resolved only at send time (resolve())."""
    parts = parse_url(url)
    if private_allowed():
        return parts
    host = parts.hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        raise RefusedTarget(f"{host} is a loopback address; set JOBSITE_WEBHOOKS_ALLOW_PRIVATE=1 to allow it")
    literal = _literal(host)
    why = literal and refusal(literal)
    if why:
        raise RefusedTarget(f"{host} is {why}; set JOBSITE_WEBHOOKS_ALLOW_PRIVATE=1 to allow it")
    return parts


def resolve(url: str) -> Target:
    """Resolve the URL's host now and pick an allowed address to pin the request to; RefusedTarget when none
    is allowed (naming the address and why) or the name does not resolve."""
    parts = parse_url(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    hostname = parts.hostname or ""
    try:
        infos = socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise RefusedTarget(f"cannot resolve {hostname}: {exc}") from None
    addresses = list(dict.fromkeys(str(info[4][0]).split("%")[0] for info in infos))
    if not addresses:
        raise RefusedTarget(f"{hostname} resolves to no address")
    if private_allowed():
        return Target(parts, hostname, port, addresses[0])
    reasons = []
    for address in addresses:
        why = refusal(address)
        if why is None:
            return Target(parts, hostname, port, address)
        reasons.append(f"{address} is {why}")
    raise RefusedTarget(
        f"refused: {hostname} resolves to {'; '.join(reasons)} (server-side request forgery guard; "
        "JOBSITE_WEBHOOKS_ALLOW_PRIVATE=1 allows it)"
    )
