"""Session tokens: bearer tokens that reach one session of the gateway and nothing else.

A session token is ``rllm-s1.<session id>.<mac>``: the session id and an HMAC-SHA256 of it, both
base64url without padding. The HMAC key is derived from the gateway's admin token, so nothing
is stored per token (no table grows with the sessions of a run) and a second gateway given the
same admin token accepts the same session tokens. The session id travels in the token so a
refusal can name the session a token belongs to; a token whose MAC does not verify names
nothing and is treated as a wrong token.

Who may use a verified token, and for how long (while the session is open), is the HTTP
layer's decision: see :class:`~rllm_core.gateway.app.GatewayApp`.
"""

from __future__ import annotations

import base64
import binascii
import hmac

from rllm_core.gateway.engine import is_session_id

__all__ = ["SESSION_TOKEN_PREFIX", "SessionTokens"]

SESSION_TOKEN_PREFIX = "rllm-s1"
"""The first field of every session token (the format's version)."""

_KEY_LABEL = b"rllm-core gateway session token v1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SessionTokens:
    """Mints and verifies the session tokens of the gateway whose admin token is
    ``admin_token``."""

    def __init__(self, admin_token: str) -> None:
        if not admin_token:
            raise ValueError("session tokens need a non-empty admin token to derive their key")
        self._key = hmac.digest(admin_token.encode(), _KEY_LABEL, "sha256")

    def _mac(self, session_id: str) -> str:
        return _b64(hmac.digest(self._key, session_id.encode(), "sha256"))

    def mint(self, session_id: str) -> str:
        """The token that reaches session ``session_id``; the same id always gives the same
        token. Raises :class:`ValueError` for an id the gateway does not accept."""
        if not is_session_id(session_id):
            raise ValueError(
                f"session id {session_id!r} is invalid: use letters, digits and '._:@-',"
                " starting with a letter or digit"
            )
        sid = _b64(session_id.encode())
        return f"{SESSION_TOKEN_PREFIX}.{sid}.{self._mac(session_id)}"

    def session_of(self, token: str) -> str | None:
        """The session id a genuine session token reaches; ``None`` for anything else (an
        admin token, a forged or truncated token, random text)."""
        prefix, _, rest = token.partition(".")
        encoded, _, mac = rest.partition(".")
        if prefix != SESSION_TOKEN_PREFIX or not encoded or not mac:
            return None
        try:
            raw = _unb64(encoded)
            session_id = raw.decode()
        except (binascii.Error, ValueError):
            return None
        if _b64(raw) != encoded or not is_session_id(session_id):
            return None
        if not hmac.compare_digest(mac.encode(), self._mac(session_id).encode()):
            return None
        return session_id
