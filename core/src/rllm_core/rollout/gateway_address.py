"""Whether the run's gateway can listen where the plan says, and the error when it cannot."""

from __future__ import annotations

import errno
import socket

__all__ = ["GatewayBindError", "check_gateway_address", "gateway_bind_error"]


class GatewayBindError(Exception):
    """The gateway cannot listen on the plan's ``[gateway].host`` / ``[gateway].port``; the
    message names the address, the key and the plan file, and says what to do."""


def gateway_bind_error(exc: OSError, *, host: str, port: int, plan_path: str) -> GatewayBindError:
    """The :class:`GatewayBindError` for ``exc``, raised by binding ``host``:``port``."""
    if exc.errno == errno.EADDRINUSE:
        return GatewayBindError(
            f"{plan_path}: [gateway].port: port {port} on {host} is already in use; free it"
            " (stop the process listening on it) or set port = 0 under [gateway] to use a"
            " free port"
        )
    if exc.errno == errno.EACCES:
        return GatewayBindError(
            f"{plan_path}: [gateway].port: binding port {port} on {host} is not permitted"
            " (ports below 1024 need privileges); choose a port above 1023, or 0 for a free"
            " port"
        )
    reason = exc.strerror or str(exc)
    return GatewayBindError(
        f"{plan_path}: [gateway].host: cannot listen on {host} port {port} ({reason}); set"
        " host under [gateway] to an address of this machine (127.0.0.1 by default)"
    )


def check_gateway_address(host: str, port: int, *, plan_path: str) -> None:
    """Bind ``host``:``port`` the way the gateway will, and let go; raises
    :class:`GatewayBindError` when that fails. Port 0 checks only the host."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        probe = socket.create_server((host.strip("[]"), port), family=family)
    except OSError as exc:
        raise gateway_bind_error(exc, host=host, port=port, plan_path=plan_path) from None
    probe.close()
