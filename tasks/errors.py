"""One exception family. Every message is a sentence naming the file and key, expected vs found, and the remedy."""

from __future__ import annotations


class PipelineError(Exception):
    """Base of every error this project raises on purpose; the CLI prints it and exits 2."""


def without_library_causes(fn, *args):
    """`fn(*args)`, its PipelineError stripped of the library errors it was raised from: a Dask worker's error
    reaches the client pickled with the exceptions beneath it (distributed uses tblib), and botocore's do not
    unpickle, so the client would receive `Exception("CacheError(...)")` in its place, under a traceback. The
    client's CLI then prints the worker's sentence as its own (pipeline/jobs/graph.py wraps every task)."""
    try:
        return fn(*args)
    except PipelineError as e:
        e.__cause__ = e.__context__ = None
        raise


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
