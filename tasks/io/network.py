"""Every request to an object store, through a network that fails: what is a network fault, how it is retried,
when a transfer counts as stalled, and the one sentence said when the retries run out.

- **A network fault** (`fault_of`): a connection refused, reset or cut (a body that ends before its
  Content-Length included), a timeout, or the store's answer 500, 502, 503, 504 or `SlowDown`. Only these are
  retried. A refusal, a missing key, and bytes that arrive whole and fail their check are not the network's:
  they are raised at once, and only the last is called corruption.
- **Retries** (`with_retries`): `ATTEMPTS` tries in all, each after a wait drawn at random up to
  `BACKOFF_BASE * 2**n` seconds (`GR00T_BACKOFF_SECONDS` for the base), capped at `BACKOFF_CAP` ("full jitter", so that a fleet of clients cut at once
  do not come back at once). A throttled request (503, `SlowDown`) waits `THROTTLE_FACTOR` times longer, and holds
  every request of this process until then: a store that says "slow down" is asked less, as botocore's `adaptive`
  mode does. Each retry is counted (`retries_so_far`), by what happened.
- **The stall limit**: a request whose socket moves no byte for `stall_seconds()` is abandoned (the socket's
  read timeout: it bounds each send and each receive, not the transfer) and retried. Default `STALL_SECONDS`,
  or `GR00T_STALL_SECONDS`, which `--stall-seconds` sets. A connection must be made within `CONNECT_SECONDS`.
- **When they run out**: `NetworkError`, one sentence naming the store's object, what happened and how often, and
  the remedy: the network or the endpoint, and running the command again. Never `--force`: the entry is not at fault.

Boto3's own retries are off (`s3_client`), so that these are the only ones, and counted once. Its `Expect:
100-continue` header is never sent: botocore waits for the interim response in a loop that never ends when the
connection closes during it (botocore issues #3755, #3613); without it a PUT sends its body at once, which S3
takes as it takes any other.
"""

from __future__ import annotations

import errno
import functools
import os
import random
import threading
import time
from collections import Counter
from typing import Callable, TypeVar

from tasks.errors import ConfigError, PipelineError

ATTEMPTS = 8              # tries in all, the first included
BACKOFF_BASE = 0.1        # seconds: the first retry waits up to this, each next one up to twice as long
BACKOFF_CAP = 5.0         # seconds: no wait is drawn from a longer span
THROTTLE_FACTOR = 4       # a throttled request waits this many times longer (up to THROTTLE_FACTOR * BACKOFF_CAP)
STALL_SECONDS = 30.0      # default stall limit: no byte moved for this long and the request is abandoned
CONNECT_SECONDS = 10.0    # a connection not made within this is a timeout
STALL_ENV = "GR00T_STALL_SECONDS"
BACKOFF_ENV = "GR00T_BACKOFF_SECONDS"

UNREACHABLE, CUT, TIMEOUT, THROTTLED, SERVER = "unreachable", "connection cut", "timeout", "throttled", "server error"
RETRIED = {UNREACHABLE: "the object store cannot be reached", CUT: "the connection was cut",
            TIMEOUT: "no byte moved within the stall limit", THROTTLED: "the store answered 503 SlowDown (throttled)",
            SERVER: "the store answered a server error"}

T = TypeVar("T")


class NetworkError(PipelineError):
    """A request to an object store that failed on the network every time it was tried; the entry is not at fault."""


class ShortBody(ConnectionError):
    """A response body that ended before its Content-Length: the connection was cut, not the object."""


def with_field(response: dict, field: str, what: str) -> dict:
    """`response` (boto3's) if it holds `field`, which every complete answer to its request does. A connection cut
    inside the response's headers ends them early, and http.client reads that as a complete answer without them
    (a GET or HEAD without its length, a listing without its body: an empty bucket); that is a cut (ShortBody)."""
    if field not in response:
        raise ShortBody(f"the answer to {what} ended before its {field}")
    return response


def stall_seconds() -> float:
    """The stall limit in force: `GR00T_STALL_SECONDS` (what `--stall-seconds` sets), else `STALL_SECONDS`."""
    return _seconds_from(STALL_ENV, STALL_SECONDS, "the stall limit, a number of seconds above 0 such as 30")


def backoff_base() -> float:
    """The first retry's longest wait: `GR00T_BACKOFF_SECONDS`, else `BACKOFF_BASE` (a test of many faults, or a
    user on a fast local store, may shorten every wait; the doubling, the cap and the tries are the same)."""
    return _seconds_from(BACKOFF_ENV, BACKOFF_BASE, "the first retry's longest wait, a number of seconds above 0 such "
                                                    "as 0.1")


def _seconds_from(name: str, default: float, what: str) -> float:
    """A number of seconds from the environment, or `default` where it is unset; a value that is not one is one
    sentence (never silently the default: a user who set it meant something)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):
        raise ConfigError(f"{name}={text[:40]!r} is not {what}; set it so, or unset it for {default:g}")
    return value


def _names(e: BaseException) -> set[str]:
    return {c.__name__ for c in type(e).__mro__}


_UNREACHABLE_NAMES = {"EndpointConnectionError", "NewConnectionError", "ClientConnectorError"}
_CUT_NAMES = {"ConnectionClosedError", "ResponseStreamingError", "IncompleteReadError", "ProtocolError",
              "IncompleteRead", "RemoteDisconnected", "ClientPayloadError", "ServerDisconnectedError",
              "ClientOSError", "ConnectionError", "BadStatusLine", "LineTooLong"}
_TIMEOUT_NAMES = {"ReadTimeoutError", "ConnectTimeoutError", "TimeoutError", "FSTimeoutError", "ServerTimeoutError"}
_THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
                   "ServiceUnavailable", "RequestThrottled"}
_SERVER_CODES = {"InternalError", "RequestTimeout", "BadGateway", "GatewayTimeout"}


def fault_of(e: BaseException) -> str | None:
    """What happened on the network, if `e` is a network fault (one of CUT, TIMEOUT, THROTTLED, SERVER); None for
    anything else. Named by class, not imported: botocore, urllib3, aiohttp and http.client each say it their way."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:  # s3fs and botocore wrap the socket's error in their own
        seen.add(id(e))
        names = _names(e)
        if names & _TIMEOUT_NAMES:
            return TIMEOUT
        if isinstance(e, ConnectionRefusedError) or names & _UNREACHABLE_NAMES:
            return UNREACHABLE
        if names & _CUT_NAMES or isinstance(e, ConnectionError):
            return CUT
        response = getattr(e, "response", None)
        if isinstance(response, dict):  # botocore's ClientError
            code = str(response.get("Error", {}).get("Code", ""))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
            if code == "500" and "xml" in headers.get("content-type", ""):
                # an answer whose XML did not arrive whole: botocore calls it a 500 to have it retried
                return CUT
            if code in _THROTTLE_CODES or status in (503, 429):
                return THROTTLED
            if code in _SERVER_CODES or status in (500, 502, 504):
                return SERVER
            return None
        if isinstance(e, OSError) and e.errno == errno.EBUSY:  # s3fs's translation of SlowDown
            return THROTTLED
        e = e.__cause__ or e.__context__
    return None


class _Pacing:
    """The retries of this process: how many, by what happened, and until when a throttled store is left alone."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.quiet_until = 0.0

    def wait_turn(self) -> None:
        with self.lock:
            pause = self.quiet_until - time.monotonic()
        if pause > 0:
            time.sleep(pause)

    def retry_after(self, fault: str, attempt: int) -> None:
        base = backoff_base() * (THROTTLE_FACTOR if fault == THROTTLED else 1)
        cap = BACKOFF_CAP * (THROTTLE_FACTOR if fault == THROTTLED else 1)
        pause = random.uniform(0, min(cap, base * 2 ** attempt))
        with self.lock:
            self.counts[fault] += 1
            if fault == THROTTLED:
                self.quiet_until = max(self.quiet_until, time.monotonic() + pause)
        time.sleep(pause)


PACING = _Pacing()


def retries_so_far() -> dict[str, int]:
    """Every retry this process made, by what happened (a summary takes the difference around its run)."""
    with PACING.lock:
        return dict(PACING.counts)


def retries_since(before: dict[str, int]) -> dict[str, int]:
    """The retries made since `before` (what `retries_so_far` said then), by what happened."""
    return {k: n - before.get(k, 0) for k, n in sorted(retries_so_far().items()) if n - before.get(k, 0)}


def with_retries(what: str, call: Callable[[], T], attempts: int = ATTEMPTS, stall: float | None = None) -> T:
    """`call()`, tried again after each network fault, up to `attempts` tries; then NetworkError naming `what`
    (the object, as the user knows it) and, for a timeout, the stall limit the call ran with (`stall`; None: the
    default). Only for a call that may run twice: a GET, a listing, a DELETE, and a PUT of an object whose bytes do
    not change between tries (a content-addressed object, a manifest, a ref)."""
    said = ""
    for attempt in range(attempts):
        PACING.wait_turn()
        try:
            return call()
        except Exception as e:
            fault = fault_of(e)
            if fault is None:
                raise
            said = _gave_up(what, fault, attempts, e, stall or stall_seconds())
        if attempt + 1 < attempts:
            PACING.retry_after(fault, attempt)
    raise NetworkError(said)  # outside the handler: a worker's error pickles without botocore's beneath it


def _gave_up(what: str, fault: str, attempts: int, e: BaseException, stall: float) -> str:
    detail = str(e).split("\n")[0][:160]
    limit = f" of {stall:g} s (--stall-seconds)" if fault == TIMEOUT else ""
    return (f"{what}: {RETRIED[fault]}{limit}, on each of {attempts} tries ({detail}); a network fault, not damaged "
            "data: check the network and AWS_ENDPOINT_URL, then run the same command again")


def s3_client(stall: float | None = None):
    """boto3's S3 client, as every request of this project makes it: a connect timeout, the stall limit as its read
    timeout, boto3's own retries off (`with_retries` does them, and counts them), no `Expect: 100-continue`."""
    import boto3
    from botocore.config import Config
    from botocore.handlers import add_expect_header

    client = boto3.client("s3", config=Config(
        max_pool_connections=64, connect_timeout=CONNECT_SECONDS, read_timeout=stall or stall_seconds(),
        retries={"total_max_attempts": 1}, tcp_keepalive=True))
    client.meta.events.unregister("before-call.s3", add_expect_header)
    return client


def s3fs_options(stall: float | None = None) -> dict:
    """s3fs (a checkpoint's folder in an S3 bucket, listed through universal_pathlib) set up as `s3_client` is: a
    connect timeout, the stall limit as its read timeout, and botocore's own retries off. s3fs tries each call five
    times itself (its waits 0.1 s growing 1.7x); botocore's legacy retries inside each of those made a network that
    never answers take 44 s to say so, and a stalled listing wait botocore's 60 s a try. `stall`: the stall limit
    (None: the default), which the path carries to whoever reads through it (tasks/io/file_blocks.py)."""
    return {"config_kwargs": {"connect_timeout": CONNECT_SECONDS, "read_timeout": stall or stall_seconds(),
                              "retries": {"total_max_attempts": 1}}}


def shared_s3_client(stall: float):
    """One client per process, stall limit, endpoint and access key: its connections are pooled across every store
    and source that ask with the same."""
    return _client_for(stall, os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("AWS_ACCESS_KEY_ID"))


@functools.cache
def _client_for(stall: float, endpoint: str | None, access_key: str | None):
    return s3_client(stall)
