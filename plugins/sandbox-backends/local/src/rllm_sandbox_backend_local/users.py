"""Resolving the user a command runs as."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

__all__ = ["User", "current_user", "resolve_user"]


@dataclass(frozen=True, slots=True)
class User:
    name: str
    uid: int
    gid: int
    home: str


def resolve_user(name: str) -> User:
    """Look ``name`` (a user name or a numeric uid) up in this machine's user database.

    Sandboxes read the same ``/etc/passwd`` as the host, so a user must exist there. Raises
    ``LookupError`` naming the user and what to do.
    """
    try:
        if name.isdigit():
            uid = int(name)
            try:
                entry = pwd.getpwuid(uid)
            except KeyError:
                return User(name=name, uid=uid, gid=uid, home="/")
        else:
            entry = pwd.getpwnam(name)
    except KeyError:
        raise LookupError(
            f"user {name!r} does not exist on this machine, and local sandboxes share its user"
            " database (/etc/passwd); create the user on the host, use a numeric uid, or leave"
            " user unset to run as the current user"
        ) from None
    return User(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)


def current_user() -> User:
    uid = os.geteuid()
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return User(name=str(uid), uid=uid, gid=os.getegid(), home="/")
    return User(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)
