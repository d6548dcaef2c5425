"""One exception family. Every message is a sentence naming the file and key, expected vs found, and the remedy."""

from __future__ import annotations


class PipelineError(Exception):
    """Base of every error this project raises on purpose; the CLI prints it and exits 2."""


class ConfigError(PipelineError, ValueError):
    """A version, embodiment, profile or option that does not exist."""


class CheckpointError(PipelineError, ValueError):
    """A checkpoint file that is malformed, inconsistent or missing."""

    def __init__(self, path: object, message: str, key: str | None = None):
        where = f"{path}" + (f", key {key!r}" if key else "")
        super().__init__(f"{where}: {message}")
        self.path, self.key = path, key


class RecipeError(PipelineError, ValueError):
    """A source key no recipe rule consumes, or a rule that consumes nothing."""


class CacheError(PipelineError):
    """A cache entry that is missing, incomplete, tampered with or made from another source."""
