"""Bearer-token auth for mutating routes, compared in constant time."""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path


def load_or_create_token(token: str | None, path: Path) -> tuple[str, bool]:
    """The token from settings, else from `path`, else a new one written there with mode 0600.

    Returns (token, created): the caller prints a created token once, so the operator sees it.
    """
    if token:
        return token, False
    if path.is_file():
        text = path.read_text().strip()
        if text:
            return text, False
    path.parent.mkdir(parents=True, exist_ok=True)
    new = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(new + "\n")
    os.chmod(path, 0o600)  # the umask may have widened it
    return new, True


def token_matches(header: str | None, expected: str) -> bool:
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), expected.encode())
