"""What a host name or address says about who can reach it."""

from __future__ import annotations

import ipaddress

__all__ = ["is_local_only", "is_loopback"]


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    address = _address(host)
    return address is not None and address.is_loopback


def is_local_only(host: str) -> bool:
    """True for a host another machine cannot reach this one at: loopback, link-local, or the
    unspecified address (``0.0.0.0``, ``::``, which a server binds but no URL can name)."""
    if is_loopback(host):
        return True
    address = _address(host)
    return address is not None and (address.is_link_local or address.is_unspecified)
