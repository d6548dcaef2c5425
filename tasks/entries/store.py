"""Where cache entries live: one small interface, with a local directory or an object store behind it.

Keys are `/`-separated paths relative to the cache root. Callers ask a store what it can do, never what it is
(tests/test_store.py pins each answer for both stores):
- `can_rename`: a local directory builds an entry beside its final name and publishes it by rename; an object
  store has no rename, so its entry's objects are put first and `MANIFEST.json` last (tasks/entries/publish.py);
- `pooled`: where an entry keeps its chunks and device files. A local directory keeps them in the entry's folder,
  a Zarr group any Zarr reader opens, and entries share bytes by hard links (`LocalStore.copy_many`). An object
  store has no links: every entry's bytes are objects under `objects/`, named by their sha256 and shared by every
  entry that holds them, and the manifest names each one (tasks/entries/names.py `object_key`);
- `local_path(key)`: where a key is a file on this machine (a local directory), so it can be read block by block,
  mapped, or handed to ttnn by name; None for an object store, read through `get`;
- `supports_leases`: readers take a lock and name their pid beside the entries (pipeline/cache/leases.py), which
  means something only where every process shares the filesystem;
- `written` and `freshen`: when each object was last written, and writing that time again without the bytes:
  `cache gc` removes an object no manifest names only once it is older than a grace period, and a convert
  freshens an old object it is about to name (as git freshens an object it would have written).
Everything else — listing, reading a chunk into a caller's buffer, verifying — is the same code for both.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import threading
import uuid
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Mapping

import numpy as np

from tasks.bulk_write import nbytes, write_bytes_atomic
from tasks.errors import CacheError, PipelineError
from tasks.file_blocks import is_url, read_full, read_into  # is_url: callers ask the store
from tasks.network import (RETRIED, UNREACHABLE, ShortBody, fault_of, shared_s3_client, stall_seconds, whole,
                           with_retries)

_DOWNLOADS_MADE = threading.Lock()
IN_FLIGHT = 16  # requests to an object store at once: freshenings, and a load's fetches (`--transfers`)


class Store(ABC):
    can_rename: bool = False
    supports_leases: bool = False
    pooled: bool = False

    def local_path(self, key: str) -> Path | None:
        """Where the object `key` is, or would be, a file on this machine; None where objects are not local files."""
        return None

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""

    @abstractmethod
    def put(self, key: str, data: bytes | memoryview) -> None:
        """Write a whole object; readers see the old object or the new one, never a mix."""

    @abstractmethod
    def sizes(self, prefix: str) -> dict[str, int]:
        """Every key under `prefix` (recursively), sorted, with its size in bytes (one listing, no reads)."""

    def list(self, prefix: str) -> list[str]:
        return list(self.sizes(prefix))

    @abstractmethod
    def written(self, prefix: str) -> dict[str, float]:
        """Every key under `prefix` (recursively), sorted, with when it was last written (unix seconds)."""

    def last_written(self, prefix: str) -> float | None:
        """When the newest object under `prefix` was written; None when there is none. How `cache gc` tells an
        abandoned push from one in flight."""
        return max(self.written(prefix).values(), default=None)

    @abstractmethod
    def freshen(self, keys: list[str]) -> set[str]:
        """Mark each object as written now, its bytes untouched; returns the keys freshened (one that is gone is
        left out: the caller writes it again)."""

    def usage(self, prefix: str) -> tuple[int, int, dict]:
        """Bytes under `prefix`; how many of them are its own (removing `prefix` frees exactly those: a local
        cache shares bytes between entries by hard links, an object store shares none); and each stored file's
        identity -> size, for totals that count shared bytes once."""
        sizes = self.sizes(prefix)
        return sum(sizes.values()), sum(sizes.values()), dict(sizes)

    @abstractmethod
    def children(self, prefix: str) -> list[str]:
        """The names directly under `prefix` (objects or folders), sorted."""

    @abstractmethod
    def delete(self, prefix: str) -> None:
        """Remove every key under `prefix` (and the key itself)."""

    def delete_many(self, keys: list[str]) -> None:
        """Remove these objects (one that is gone already is no error)."""
        for key in keys:
            self.delete(key)

    @abstractmethod
    def describe(self, key: str) -> str:
        """The key as the user knows it (a path or a URL), for messages."""

    def put_many(self, objects: Mapping[str, bytes]) -> None:
        """Write several objects, each one whole as `put` writes it; a store may send them concurrently."""
        for key, data in objects.items():
            self.put(key, data)

    def read_into(self, key: str, out: np.ndarray) -> None:
        """Fill `out` with the object, which must hold exactly `out.nbytes` bytes."""
        data = self.get(key)
        _check_size(self, key, None if data is None else len(data), out.nbytes)
        out.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, np.uint8)

    def map(self, key: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """The object as a writable array of `shape` (locally a private memory map of the file, no copy)."""
        out = np.empty(shape, dtype)
        self.read_into(key, out)
        return out

    def local_file(self, key: str) -> Path | None:
        """A local file holding the object (ttnn loads from a path), or None when it does not exist."""
        data = self.get(key)
        if data is None:
            return None
        with _DOWNLOADS_MADE:  # once per store: a second folder would replace (and delete) the first
            if not hasattr(self, "_downloads"):
                self._downloads = tempfile.TemporaryDirectory(prefix="gr00t-store-")
        path = Path(self._downloads.name) / key.replace("/", "%")
        fetched = path.with_name(f"{path.name}.{uuid.uuid4().hex}")
        fetched.write_bytes(data)  # buffered, not O_DIRECT: ttnn reads it next, from the page cache
        os.replace(fetched, path)  # a new file each time: a tensor mapping an earlier fetch keeps its bytes
        return path

    def get_json(self, key: str) -> dict | None:
        raw = self.get(key)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise CacheError(f"{self.describe(key)}: not valid JSON ({e}); the object is corrupt") from e

    def put_json(self, key: str, doc: object) -> None:
        self.put(key, (json.dumps(doc, indent=1) + "\n").encode())


def _read_body_into(body, view: memoryview) -> int:
    """A boto3 response body (or the urllib3 response it is, entered) read into `view`; the bytes read.

    urllib3 2's `readinto` reads into a new bytes object and copies it. So where the body is a plain urllib3
    response (no content encoding) over http.client, its bytes go from the socket straight into `view` by
    http.client's own `readinto`; urllib3 is told, and at the end of the body it puts the connection back in its
    pool. 1.2 GB as 6 MB objects from moto, 16 in flight: 0.98 CPU-s through botocore's `readinto`, 0.69 straight.
    Any other body is read through botocore."""
    raw = getattr(body, "_raw_stream", body)  # botocore's StreamingBody, or the urllib3 response it enters as
    socket_side = getattr(raw, "_fp", None)
    if not (hasattr(socket_side, "readinto") and isinstance(getattr(raw, "_fp_bytes_read", None), int)
            and not raw.headers.get("content-encoding")):
        return read_full(body, view)
    filled = read_full(socket_side, view)
    raw._fp_bytes_read += filled
    raw.read()  # nothing left: urllib3 sees http.client's response closed and releases the connection
    return filled


def _check_size(store: Store, key: str, found: int | None, expected: int) -> None:
    """A missing or short object is an error, never zeros."""
    if found is None:
        raise CacheError(f"{store.describe(key)}: chunk is missing from the cache entry; run `python -m pipeline "
                         "cache verify` and convert again with --force")
    if found != expected:
        raise CacheError(f"{store.describe(key)}: chunk holds {found} bytes, expected {expected}; the entry is "
                         "corrupt — convert again with --force")


class LocalStore(Store):
    """A cache folder. Reads go through one system call into the caller's buffer, or a private memory map."""

    can_rename = True
    supports_leases = True

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def local_path(self, key: str) -> Path:
        return self.path(key)

    def path(self, key: str) -> Path:
        return self.root / key

    def get(self, key: str) -> bytes | None:
        try:
            return self.path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def put(self, key: str, data: bytes | memoryview) -> None:
        write_bytes_atomic(self.path(key), data)

    def copy_many(self, pairs: Mapping[str, str]) -> set[str]:
        """Each `new key -> existing key` of `pairs` as a hard link (a copy across filesystems); returns the new
        keys made. One whose source is gone (removed meanwhile) is left out, not an error: the caller makes that
        file itself."""
        made = set()
        for new, old in pairs.items():
            try:
                link_or_copy(self.path(old), self.path(new))
            except FileNotFoundError:
                continue
            made.add(new)
        return made

    def sizes(self, prefix: str) -> dict[str, int]:
        base = self.path(prefix)
        files = sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []
        return {p.relative_to(self.root).as_posix(): p.stat().st_size for p in files}

    def written(self, prefix: str) -> dict[str, float]:
        base = self.path(prefix)
        files = sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else [base] if base.is_file() else []
        return {p.relative_to(self.root).as_posix(): p.stat().st_mtime for p in files}

    def freshen(self, keys: list[str]) -> set[str]:
        done = set()
        for key in keys:
            try:
                os.utime(self.path(key))
            except FileNotFoundError:
                continue
            done.add(key)
        return done

    def usage(self, prefix: str) -> tuple[int, int, dict]:
        size, links, stats = 0, {}, {}
        for p in self.path(prefix).rglob("*"):
            if p.is_file():
                st = p.stat()
                size += st.st_size
                ident = (st.st_dev, st.st_ino)
                links[ident] = links.get(ident, 0) + 1
                stats[ident] = st
        # own: every name of the file is under `prefix`, so removing it frees the bytes (whatever order a
        # listing visits entries in)
        own = sum(st.st_size for ident, st in stats.items() if links[ident] >= st.st_nlink)
        return size, own, {ident: st.st_size for ident, st in stats.items()}

    def children(self, prefix: str) -> list[str]:
        base = self.path(prefix)
        return sorted(p.name for p in base.iterdir()) if base.is_dir() else []

    def delete(self, prefix: str) -> None:
        path = self.path(prefix)
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except FileNotFoundError:
            pass  # gone already (another process removed it)
        except OSError as e:  # never report a removal that did not happen
            raise CacheError(f"{path}: could not be removed ({e.strerror}); check the cache folder's permissions") from None

    def describe(self, key: str) -> str:
        return str(self.path(key)) if key else str(self.root)

    def _open(self, key: str, nbytes: int) -> int:
        try:
            fd = os.open(self.path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            _check_size(self, key, None, nbytes)
        size = os.fstat(fd).st_size
        if size != nbytes:
            os.close(fd)
            _check_size(self, key, size, nbytes)
        return fd

    def read_into(self, key: str, out: np.ndarray) -> None:
        fd = self._open(key, out.nbytes)
        try:
            read_into(fd, 0, out, self.path(key))
        finally:
            os.close(fd)

    def map(self, key: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        # The page cache's pages, not a copy into fresh memory (which costs more than the read on a VM that hands
        # out pages lazily); copy-on-write, so a caller's writes stay private.
        size = nbytes(shape, dtype)
        os.close(self._open(key, size))
        if size == 0:
            return np.empty(shape, dtype)
        return np.memmap(self.path(key), dtype=dtype, mode="c", shape=shape)

    def local_file(self, key: str) -> Path | None:
        return self.path(key) if self.path(key).is_file() else None


_MISSING = {"NoSuchKey", "NoSuchBucket", "404", "NotFound"}
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "AllAccessDisabled", "ExpiredToken",
           "InvalidToken", "AccountProblem"}


def _s3_code(e: BaseException) -> str:
    """The error code of an S3 answer (botocore's ClientError), or ''."""
    response = getattr(e, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def object_store_failure(e: BaseException, instead: str = "pass a local folder as --cache") -> str | None:
    """What the user should hear when an object store refuses or cannot be reached, or None for anything else
    (`instead`: what to do without the store). Named by class, not imported: the store may be any fsspec
    backend, and botocore is s3fs's. (A network fault that outlasted its retries is a NetworkError already.)"""
    names = {c.__name__ for c in type(e).__mro__}
    if isinstance(e, PermissionError) or _s3_code(e) in _DENIED:
        return ("access denied by the object store; check the credentials (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or ~/.aws) and that they may read and write this bucket")
    if "NoCredentialsError" in names:
        return "no credentials for the object store; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or ~/.aws)"
    fault = fault_of(e)
    if fault == UNREACHABLE:
        return f"the object store cannot be reached ({e}); check AWS_ENDPOINT_URL and the network, or {instead}"
    if fault is not None:  # what a library's own retries gave up on (s3fs reads a checkpoint's folder)
        return (f"{RETRIED[fault]} ({str(e).splitlines()[0][:160]}); a network fault: check the network and "
                f"AWS_ENDPOINT_URL, then run the same command again, or {instead}")
    return None


WRITES = ("put", "put_many")  # where a missing object can only mean a missing bucket


def _speaks(method):
    """An object-store call whose refusal becomes one sentence (CacheError), never a traceback; a network fault
    arrives here as a NetworkError (tasks/network.py), which already is one; every other error passes through."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except PipelineError:
            raise
        except Exception as e:
            said = object_store_failure(e)
            missing = isinstance(e, FileNotFoundError) or _s3_code(e) in _MISSING
            if said is None and missing and method.__name__ in WRITES:
                bucket = f"{self.url.split('://')[0]}://{self.bucket}"
                said = f"the bucket {bucket} does not exist; create it (for S3: `aws s3 mb {bucket}`) or name one that does"
            if said is None:
                raise
        raise CacheError(f"{self.url}: {said}")  # outside the handler: pickles without the library's error beneath
    return call


class _ObjectStore(Store):
    """What an object store's two backends share: a URL `scheme://bucket/prefix`, keys under the prefix, and
    whole objects (no rename, no links: every entry's bytes are shared objects, `pooled`)."""

    pooled = True

    def __init__(self, url: str):
        scheme, _, place = url.partition("://")
        if not place.strip("/"):
            raise CacheError(f"{url}: names no bucket; pass {scheme}://BUCKET or {scheme}://BUCKET/PREFIX")
        self.url = url.rstrip("/")
        self.bucket, _, self.prefix = place.strip("/").partition("/")

    def _key(self, key: str) -> str:
        """The object's key in its bucket."""
        return "/".join(part for part in (self.prefix, key) if part)

    def describe(self, key: str) -> str:
        return f"{self.url}/{key}" if key else self.url

    def _retried(self, key: str, call):
        """`call()` through tasks/network.py's retries, a fault named by the object `key`."""
        return with_retries(self.describe(key), call)


class S3Store(_ObjectStore):
    """An S3 bucket (any S3 API: the endpoint comes from AWS_ENDPOINT_URL when set), through boto3's client, whose
    requests run on as many threads as ask: 2.5 GB in 100 objects from moto, 16 in flight, took 1.7-1.9 s through
    boto3 and 3.5-4.3 s through s3fs. Every request goes through `with_retries` (tasks/network.py): a network
    fault is retried, and said in one sentence when it outlasts them; a refusal is one sentence (`_speaks`); a
    bucket that does not exist reads as empty and refuses writes in one sentence. Every request may run twice: a
    PUT writes a whole object whose bytes do not change between tries (one under `objects/` is named by its
    sha256; a manifest or a ref is the same document), a DELETE of what is gone is no error, and the rest read."""

    def __init__(self, url: str, stall: float | None = None):
        super().__init__(url)
        try:
            self._client = shared_s3_client(stall or stall_seconds())
        except ImportError:
            raise CacheError(f"{url}: an S3 cache needs boto3, which is not installed; install the project with its "
                             "s3 extra (pip install 'gr00t-tt-weights[s3]')") from None

    def _get_object(self, key: str) -> dict | None:
        """boto3's response to a GET of `key`; None when there is no such key, or no such bucket (it reads as
        empty)."""
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as e:
            if _s3_code(e) in _MISSING:
                return None
            raise
        return whole(response, "ContentLength", "a GET")

    @_speaks
    def get(self, key: str) -> bytes | None:
        def fetch() -> bytes | None:
            response = self._get_object(key)
            return None if response is None else response["Body"].read()  # botocore checks the length it read
        return self._retried(key, fetch)

    @_speaks
    def read_into(self, key: str, out: np.ndarray) -> None:
        """The response is read straight into `out`: no whole copy of the object first (a one-embodiment load
        fetches 6.2 GB of a full N1.6, on two cores shared with whatever serves it). An object of another size
        than the record's is a damaged entry; a body that ends early is a cut connection, and is read again."""
        if not out.flags.c_contiguous:
            return super().read_into(key, out)

        def fetch() -> None:
            response = self._get_object(key)
            _check_size(self, key, None if response is None else response["ContentLength"], out.nbytes)
            with response["Body"] as body:
                filled = _read_body_into(body, memoryview(out.reshape(-1).view(np.uint8)))
            if filled != out.nbytes:
                raise ShortBody(f"the response ended after {filled} of {out.nbytes} bytes")
        self._retried(key, fetch)

    @_speaks
    def put(self, key: str, data: bytes | memoryview) -> None:
        self._put(key, data)

    @_speaks
    def put_many(self, objects: Mapping[str, bytes]) -> None:
        if len(objects) <= 1:
            for key, data in objects.items():
                self._put(key, data)
            return
        with ThreadPoolExecutor(min(IN_FLIGHT, len(objects))) as pool:
            list(pool.map(lambda kv: self._put(*kv), objects.items()))

    def _put(self, key: str, data: bytes | memoryview) -> None:
        body = bytes(data)  # one PUT: atomic per object; the same bytes on every try
        self._retried(key, lambda: self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=body))

    def _listed(self, prefix: str, delimiter: str = "") -> tuple[list[dict], list[str]]:
        """Every object under `prefix` (a folder: the key itself, or keys below it, never `prefix` + more) and,
        with a delimiter, the folders directly under it; one request a thousand keys, each retried."""
        full = self._key(prefix)
        asked = f"{full}/" if delimiter and full else full
        found, folders, token = [], [], None
        while True:
            kwargs = {"Bucket": self.bucket, "Prefix": asked, **({"Delimiter": delimiter} if delimiter else {}),
                      **({"ContinuationToken": token} if token else {})}

            def page() -> dict:
                try:
                    response = self._client.list_objects_v2(**kwargs)
                except Exception as e:
                    if _s3_code(e) in _MISSING:
                        return {}
                    raise
                return whole(response, "IsTruncated", "a listing")  # a cut one must never read as empty
            response = self._retried(prefix, page)
            found += [o for o in response.get("Contents", ()) if not full or o["Key"] == full
                      or o["Key"].startswith(f"{full}/")]
            folders += [p["Prefix"] for p in response.get("CommonPrefixes", ())]
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                return found, folders

    def _relative(self, key: str) -> str:
        return key[len(self.prefix) + 1:] if self.prefix else key

    @_speaks
    def sizes(self, prefix: str) -> dict[str, int]:
        return {self._relative(o["Key"]): int(o["Size"]) for o in sorted(self._listed(prefix)[0], key=lambda o: o["Key"])}

    @_speaks
    def written(self, prefix: str) -> dict[str, float]:
        return {self._relative(o["Key"]): o["LastModified"].timestamp()
                for o in sorted(self._listed(prefix)[0], key=lambda o: o["Key"])}

    @_speaks
    def children(self, prefix: str) -> list[str]:
        objects, folders = self._listed(prefix, "/")
        return sorted({k.rstrip("/").rsplit("/", 1)[-1] for k in [o["Key"] for o in objects] + folders})

    @_speaks
    def freshen(self, keys: list[str]) -> set[str]:
        def touch(key: str) -> str | None:
            where = {"Bucket": self.bucket, "Key": self._key(key)}

            def copy() -> bool:
                # CopyObject onto itself: a new LastModified, no bytes sent (S3 refuses such a copy unless the
                # metadata is replaced)
                try:
                    whole(self._client.copy_object(**where, CopySource=dict(where), MetadataDirective="REPLACE"),
                          "CopyObjectResult", "a copy")
                except Exception as e:
                    if _s3_code(e) in _MISSING:
                        return False
                    raise
                return True
            return key if self._retried(key, copy) else None

        if not keys:
            return set()
        with ThreadPoolExecutor(min(IN_FLIGHT, len(keys))) as pool:
            return {key for key in pool.map(touch, keys) if key is not None}

    @_speaks
    def delete(self, prefix: str) -> None:
        self.delete_many(list(self.sizes(prefix)))

    @_speaks
    def delete_many(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):  # S3 DeleteObjects: a thousand keys a request
            batch = {"Objects": [{"Key": self._key(k)} for k in keys[start:start + 1000]], "Quiet": True}
            response = self._retried(keys[start], lambda: self._client.delete_objects(Bucket=self.bucket, Delete=batch))
            failed = [e for e in response.get("Errors", ()) if e.get("Code") not in _MISSING]
            if failed:
                raise CacheError(f"{self.url}/{self._relative(failed[0]['Key'])}: could not be removed "
                                 f"({failed[0].get('Code')}: {failed[0].get('Message')}); check the credentials' "
                                 "permissions on the bucket")


class FsspecStore(_ObjectStore):
    """Any other object store fsspec knows (`gs://`, `memory://`, …), through its filesystem; each request goes
    through the same retries as S3's (tasks/network.py), and a refusal is one sentence (`_speaks`)."""

    def __init__(self, url: str):
        import fsspec  # lazy: only object-store caches need it

        super().__init__(url)
        self.fs, self.base = fsspec.core.url_to_fs(self.url)

    def _path(self, key: str) -> str:
        return f"{self.base}/{key}" if key else self.base

    @_speaks
    def get(self, key: str) -> bytes | None:
        def fetch() -> bytes | None:
            try:
                return self.fs.cat_file(self._path(key))
            except FileNotFoundError:
                return None
        return self._retried(key, fetch)

    @_speaks
    def put(self, key: str, data: bytes | memoryview) -> None:
        body = bytes(data)
        self._retried(key, lambda: self.fs.pipe_file(self._path(key), body))  # one PUT: atomic per object

    def _found(self, prefix: str) -> dict[str, dict]:
        def find() -> dict[str, dict]:
            try:
                return self.fs.find(self._path(prefix), detail=True)
            except FileNotFoundError:
                return {}
        return self._retried(prefix, find)

    @_speaks
    def sizes(self, prefix: str) -> dict[str, int]:
        return {p[len(self.base) + 1:]: int(info.get("size") or 0) for p, info in sorted(self._found(prefix).items())}

    @_speaks
    def written(self, prefix: str) -> dict[str, float]:
        out = {}
        for p, info in sorted(self._found(prefix).items()):
            when = info.get("LastModified") or info.get("mtime") or info.get("created")
            if when is not None:
                out[p[len(self.base) + 1:]] = when.timestamp() if hasattr(when, "timestamp") else float(when)
        return out

    @_speaks
    def freshen(self, keys: list[str]) -> set[str]:
        done = set()
        for key in keys:  # written again with its own bytes: the one write every backend has
            data = self.get(key)
            if data is not None:
                self.put(key, data)
                done.add(key)
        return done

    @_speaks
    def children(self, prefix: str) -> list[str]:
        def listing() -> list[str]:
            try:
                return self.fs.ls(self._path(prefix), detail=False, refresh=True)
            except FileNotFoundError:
                return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self._retried(prefix, listing))

    @_speaks
    def delete(self, prefix: str) -> None:
        self.delete_many(list(self.sizes(prefix)))

    @_speaks
    def delete_many(self, keys: list[str]) -> None:
        def remove(key: str) -> None:
            try:
                self.fs.rm_file(self._path(key))
            except FileNotFoundError:
                pass  # gone already: the caller's wish
        for key in keys:
            self._retried(key, lambda: remove(key))


def link_or_copy(src: Path, dst: Path) -> None:
    """`dst` as the same file as `src` (a hard link: entries share the bytes), or a copy across filesystems. An
    existing `dst` is replaced, never written through."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except FileNotFoundError:
        raise
    except OSError:
        shutil.copyfile(src, dst)  # another filesystem: a copy is still cheaper than a conversion


def open_store(root: Store | Path | str, stall: float | None = None) -> Store:
    """A store for a cache root: a local folder, or an object-store URL (`s3://bucket/prefix`; `stall`: its stall
    limit, default tasks/network.py `stall_seconds()`)."""
    if isinstance(root, Store):
        return root
    if not is_url(root):
        return LocalStore(Path(root))
    return S3Store(root, stall) if root.startswith(("s3://", "s3a://")) else FsspecStore(root)


@functools.cache
def store_at(url: str, stall: float | None = None) -> Store:
    """The store at an object-store URL, one per process and stall limit: a Dask worker's tasks reuse its client
    and connections, and keep the stall limit the client was given (a worker has its own environment)."""
    return open_store(url, stall)
