"""Control-plane settings from the environment (prefix ASTERIA_), built by a cached factory."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ASTERIA_", extra="ignore")

    host: str = "127.0.0.1"
    """Bind address; loopback unless told otherwise."""
    port: int = Field(default=8000, ge=0, le=65535)
    data_dir: Path = Path("asteria-data")
    """Holds the run store (SQLite), run folders (checkpoints, step records) and the token file."""
    token: str | None = None
    """Bearer token for mutating routes; when unset, read from (or created in) token_file."""
    token_file: Path | None = None
    """Defaults to <data_dir>/token, created with mode 0600 at first start."""
    db_path: Path | None = None
    """Defaults to <data_dir>/asteria.db."""
    allowed_paths: list[Path] = []
    """Folders (besides data_dir) whose files a request may name as a corpus, a checkpoint to
    resume or a disk-tier folder, as JSON: ASTERIA_ALLOWED_PATHS='["/srv/corpora"]'."""
    cors_origins: list[str] = []
    """Origins allowed by CORS; empty (the default) turns CORS off."""
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    """Largest request body accepted; larger bodies get 413."""
    start_default_run: bool = True
    """Start a run on the embedded default corpus when the server starts."""
    store_flush_seconds: float = Field(default=0.5, gt=0, le=60)
    """Step records are written to SQLite in batches at most this far apart."""
    live_steps_window: int = Field(default=10_000, ge=1, le=1_000_000)
    """The active run's newest step records kept in memory for polling clients."""
    auth_failures_burst: int = Field(default=20, ge=1, le=10_000)
    """Wrong bearer tokens a client (IP address) may send within auth_failures_window_seconds;
    beyond them, every request of that client carrying a token gets 429 with Retry-After."""
    auth_failures_window_seconds: float = Field(default=60.0, gt=0, le=86_400)
    """The sliding window over which a client's wrong tokens are counted."""
    dashboard_url: str | None = None
    """The dashboard's address, linked from the landing page at / when set."""
    allowed_hosts: list[str] = []
    """Host names (besides localhost, 127.0.0.1, [::1] and the bound host) a request's Host
    header may name; any other gets 400, so a page on another site cannot reach this server
    through a name of its own (DNS rebinding). As JSON: ASTERIA_ALLOWED_HOSTS='["trainer"]';
    a leading "*." allows a domain's subdomains."""
    trusted_proxies: list[str] = []
    """Addresses (or networks, 10.0.0.0/8) of reverse proxies whose X-Forwarded-For and
    X-Forwarded-Proto are believed; from any other peer, and by default from every peer, the
    client is the connection's own address (what the token throttle counts and the policy
    history records)."""
    max_connections: int = Field(default=256, ge=1, le=100_000)
    """Open HTTP connections served at once; one beyond them is answered 503 and closed at
    once. Lowered to a quarter of the process's open-file limit, so connections can never take
    the descriptors the training needs for its own files."""
    max_header_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    """Largest request head (request line and headers); a larger one is refused and closed."""
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=3600)
    """A connection that has not sent a request's complete head this long after it opened (or
    after its previous response) is closed."""
    keep_alive_seconds: float = Field(default=5.0, gt=0, le=3600)
    """An idle kept-alive connection is closed this long after its last response."""

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_addresses(cls, proxies: list[str]) -> list[str]:
        for proxy in proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(f"trusted_proxies: {proxy!r} is not an IP address or network; "
                                 "allowed: addresses such as 10.0.0.2 or networks such as "
                                 "10.0.0.0/8") from None
        return proxies

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            if not host or any(c in host for c in "/:@ ") and not host.startswith("["):
                raise ValueError(f"allowed_hosts: {host!r} is not a host name; allowed: names "
                                 "without scheme or port, such as trainer or *.example.org")
        return [h.lower() for h in hosts]

    @property
    def resolved_db_path(self) -> Path:
        return self.db_path or self.data_dir / "asteria.db"

    @property
    def resolved_token_file(self) -> Path:
        return self.token_file or self.data_dir / "token"

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"


@lru_cache
def get_settings() -> Settings:
    return Settings()
