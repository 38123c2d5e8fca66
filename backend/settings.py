"""Control-plane settings from the environment (prefix ASTERIA_), built by a cached factory."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
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
