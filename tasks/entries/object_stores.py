"""The store interface's object-store backends (tasks/entries/store.py `Store`): `S3Store`, every request through
boto3 and tasks/io/network.py's retries, and `FsspecStore`, any other fsspec filesystem. Neither can rename, and
both keep an entry's bytes as content-named objects under `objects/`; tests/test_store.py runs the one contract
suite on each. A store's failure is said in one sentence (`object_store_failure`), never as the SDK's traceback.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping

import numpy as np

from tasks.errors import CacheError, PipelineError
from tasks.io.file_blocks import read_full
from tasks.io.network import (RETRIED, UNREACHABLE, ShortBody, fault_of, shared_s3_client, stall_seconds, with_field,
                              with_retries)
from tasks.entries.store import IN_FLIGHT, Store, _check_size


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


_MISSING = {"NoSuchKey", "NoSuchBucket", "404", "NotFound"}
NO_BUCKET = "NoSuchBucket"  # never read as empty: a typo in --cache would look like a cache with nothing in it
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


def _refusals_in_one_sentence(method):
    """An object-store call whose refusal becomes one sentence (CacheError), never a traceback; a network fault
    arrives here as a NetworkError (tasks/io/network.py), which already is one; every other error passes through."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except PipelineError:
            raise
        except Exception as e:
            said = object_store_failure(e)
            missing = isinstance(e, FileNotFoundError) or _s3_code(e) in _MISSING
            if said is None and (_s3_code(e) == NO_BUCKET or missing and method.__name__ in WRITES):
                bucket = f"{self.url.split('://')[0]}://{self.bucket}"
                said = f"the bucket {bucket} does not exist; create it (for S3: `aws s3 mb {bucket}`) or name one that does"
            if said is None:
                raise
        raise CacheError(f"{self.url}: {said}")  # outside the handler: pickles without the library's error beneath
    return call


class ObjectStore(Store):
    """What an object store's two backends share: a URL `scheme://bucket/prefix`, keys under the prefix, and
    whole objects (no rename, no links: every entry's bytes are shared objects, pipeline/cache/homes.py `BucketHome`)."""

    stall: float | None = None  # the stall limit of its requests (None: the library's own)

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
        """`call()` through tasks/io/network.py's retries, a fault named by the object `key`."""
        return with_retries(self.describe(key), call, stall=self.stall)


class S3Store(ObjectStore):
    """An S3 bucket (any S3 API: the endpoint comes from AWS_ENDPOINT_URL when set), through boto3's client, whose
    requests run on as many threads as ask: 2.5 GB in 100 objects from moto, 16 in flight, took 1.7-1.9 s through
    boto3 and 3.5-4.3 s through s3fs. Every request goes through `with_retries` (tasks/io/network.py): a network
    fault is retried, and said in one sentence when it outlasts them; a refusal is one sentence (`_refusals_in_one_sentence`); a
    bucket that does not exist is said to be missing, in one sentence, by every request. Every request may run twice: a
    PUT writes a whole object whose bytes do not change between tries (one under `objects/` is named by its
    sha256; a manifest or a ref is the same document), a DELETE of what is gone is no error, and the rest read."""

    def __init__(self, url: str, stall: float | None = None):
        super().__init__(url)
        self.stall = stall or stall_seconds()
        try:
            self._client = shared_s3_client(self.stall)
        except ImportError:
            raise CacheError(f"{url}: an S3 cache needs boto3, which is not installed; install the project with its "
                             "s3 extra (pip install 'gr00t-tt-weights[s3]')") from None

    def _get_object(self, key: str) -> dict | None:
        """boto3's response to a GET of `key`; None when there is no such key (no such bucket: `_refusals_in_one_sentence` says so)."""
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as e:
            if _s3_code(e) in _MISSING - {NO_BUCKET}:
                return None
            raise
        return with_field(response, "ContentLength", "a GET")

    @_refusals_in_one_sentence
    def get(self, key: str) -> bytes | None:
        def fetch() -> bytes | None:
            response = self._get_object(key)
            return None if response is None else response["Body"].read()  # botocore checks the length it read
        return self._retried(key, fetch)

    @_refusals_in_one_sentence
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

    @_refusals_in_one_sentence
    def put(self, key: str, data: bytes | memoryview) -> None:
        self._put(key, data)

    @_refusals_in_one_sentence
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
                    if _s3_code(e) in _MISSING - {NO_BUCKET}:
                        return {}
                    raise
                return with_field(response, "IsTruncated", "a listing")  # a cut one must never read as empty
            response = self._retried(prefix, page)
            found += [o for o in response.get("Contents", ()) if not full or o["Key"] == full
                      or o["Key"].startswith(f"{full}/")]
            folders += [p["Prefix"] for p in response.get("CommonPrefixes", ())]
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                return found, folders

    def _relative(self, key: str) -> str:
        return key[len(self.prefix) + 1:] if self.prefix else key

    @_refusals_in_one_sentence
    def sizes(self, prefix: str) -> dict[str, int]:
        return {self._relative(o["Key"]): int(o["Size"]) for o in sorted(self._listed(prefix)[0], key=lambda o: o["Key"])}

    @_refusals_in_one_sentence
    def written(self, prefix: str) -> dict[str, float]:
        return {self._relative(o["Key"]): o["LastModified"].timestamp()
                for o in sorted(self._listed(prefix)[0], key=lambda o: o["Key"])}

    @_refusals_in_one_sentence
    def sizes_and_times(self, prefix: str) -> dict[str, tuple[int, float | None]]:
        return {self._relative(o["Key"]): (int(o["Size"]), o["LastModified"].timestamp() if o.get("LastModified")
                                           else None)
                for o in sorted(self._listed(prefix)[0], key=lambda o: o["Key"])}

    @_refusals_in_one_sentence
    def children(self, prefix: str) -> list[str]:
        objects, folders = self._listed(prefix, "/")
        return sorted({k.rstrip("/").rsplit("/", 1)[-1] for k in [o["Key"] for o in objects] + folders})

    @_refusals_in_one_sentence
    def freshen(self, keys: list[str]) -> set[str]:
        def touch(key: str) -> str | None:
            where = {"Bucket": self.bucket, "Key": self._key(key)}

            def copy() -> bool:
                # CopyObject onto itself: a new LastModified, no bytes sent (S3 refuses such a copy unless the
                # metadata is replaced)
                try:
                    with_field(self._client.copy_object(**where, CopySource=dict(where), MetadataDirective="REPLACE"),
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

    @_refusals_in_one_sentence
    def delete(self, prefix: str) -> None:
        self.delete_many(list(self.sizes(prefix)))

    @_refusals_in_one_sentence
    def delete_many(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):  # S3 DeleteObjects: a thousand keys a request
            batch = {"Objects": [{"Key": self._key(k)} for k in keys[start:start + 1000]], "Quiet": True}
            response = self._retried(keys[start], lambda: self._client.delete_objects(Bucket=self.bucket, Delete=batch))
            failed = [e for e in response.get("Errors", ()) if e.get("Code") not in _MISSING]
            if failed:
                raise CacheError(f"{self.url}/{self._relative(failed[0]['Key'])}: could not be removed "
                                 f"({failed[0].get('Code')}: {failed[0].get('Message')}); check the credentials' "
                                 "permissions on the bucket")


class FsspecStore(ObjectStore):
    """Any other object store fsspec knows (`gs://`, `memory://`, …), through its filesystem; each request goes
    through the same retries as S3's (tasks/io/network.py), and a refusal is one sentence (`_refusals_in_one_sentence`)."""

    def __init__(self, url: str):
        import fsspec  # lazy: only object-store caches need it

        super().__init__(url)
        self.fs, self.base = fsspec.core.url_to_fs(self.url)

    def _path(self, key: str) -> str:
        return f"{self.base}/{key}" if key else self.base

    @_refusals_in_one_sentence
    def get(self, key: str) -> bytes | None:
        def fetch() -> bytes | None:
            try:
                return self.fs.cat_file(self._path(key))
            except FileNotFoundError:
                return None
        return self._retried(key, fetch)

    @_refusals_in_one_sentence
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

    @_refusals_in_one_sentence
    def sizes(self, prefix: str) -> dict[str, int]:
        return {p[len(self.base) + 1:]: int(info.get("size") or 0) for p, info in sorted(self._found(prefix).items())}

    @_refusals_in_one_sentence
    def written(self, prefix: str) -> dict[str, float]:
        out = {}
        for p, info in sorted(self._found(prefix).items()):
            when = info.get("LastModified") or info.get("last_modified") or info.get("mtime") or info.get("created")
            if when is not None:
                out[p[len(self.base) + 1:]] = when.timestamp() if hasattr(when, "timestamp") else float(when)
        return out

    @_refusals_in_one_sentence
    def freshen(self, keys: list[str]) -> set[str]:
        done = set()
        for key in keys:  # written again with its own bytes: the one write every backend has
            data = self.get(key)
            if data is not None:
                self.put(key, data)
                done.add(key)
        return done

    @_refusals_in_one_sentence
    def children(self, prefix: str) -> list[str]:
        def listing() -> list[str]:
            try:
                return self.fs.ls(self._path(prefix), detail=False, refresh=True)
            except FileNotFoundError:
                return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self._retried(prefix, listing))

    @_refusals_in_one_sentence
    def delete(self, prefix: str) -> None:
        self.delete_many(list(self.sizes(prefix)))

    @_refusals_in_one_sentence
    def delete_many(self, keys: list[str]) -> None:
        def remove(key: str) -> None:
            try:
                self.fs.rm_file(self._path(key))
            except FileNotFoundError:
                pass  # gone already: the caller's wish
        for key in keys:
            self._retried(key, lambda: remove(key))
