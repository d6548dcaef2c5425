"""A bad network between the project and moto's S3 server: an HTTP proxy that, request by request, cuts the
connection mid-request or mid-response, answers 503 `SlowDown`, or stalls, each with a probability of its own,
drawn from a seeded generator (the same seed, the same faults in the same order of requests).

It reads each request whole before it forwards it (one fresh connection to moto per request), so moto never sees a
request cut short: as S3 keeps nothing of a PUT whose body did not arrive. What the client sees:
- `cut_request`: the connection reset while the request is still being sent (half its body read);
- `cut_interim`: for a request that asks for `Expect: 100-continue`, the interim response cut after its status
  line (the path botocore issue #3755 reports looping forever);
- `slowdown`: `503 SlowDown`, as S3 throttles a prefix, the connection kept;
- `stall`: nothing at all for `stall_for` seconds, then the connection closed;
- `cut_response`: half of moto's response, then the connection closed (a body shorter than its Content-Length).
`counts` says how many of each it did, and `requests` how many it saw."""

from __future__ import annotations

import random
import socket
import struct
import threading
from collections import Counter

FAULTS = ("cut_request", "cut_interim", "slowdown", "stall", "cut_response")
SLOW_DOWN = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your "
             b"request rate.</Message></Error>")


class FaultyProxy:
    def __init__(self, upstream_port: int, seed: int = 0, stall_for: float = 3.0, **rates: float):
        self.upstream = ("127.0.0.1", upstream_port)
        self.rng, self.lock = random.Random(seed), threading.Lock()
        self.rates: dict[str, float] = {}
        self.set(**rates)
        self.stall_for = stall_for
        self.counts: Counter[str] = Counter()
        self.requests = 0
        self.asked_to_continue = 0  # requests that carried `Expect: 100-continue`
        self.closed = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, **rates: float) -> None:
        """The probability of each fault per request from now on (one left out: 0)."""
        unknown = set(rates) - set(FAULTS)
        assert not unknown, unknown
        with self.lock:
            self.rates = {fault: rates.get(fault, 0.0) for fault in FAULTS}

    def close(self) -> None:
        self.closed.set()
        self.server.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _draw(self, expect: bool) -> str | None:
        with self.lock:
            self.requests += 1
            self.asked_to_continue += expect
            roll = self.rng.random()
            for fault in FAULTS:
                if fault == "cut_interim" and not expect:
                    continue
                if roll < self.rates[fault]:
                    self.counts[fault] += 1
                    return fault
                roll -= self.rates[fault]
        return None

    def _serve(self, client: socket.socket) -> None:
        client.settimeout(60)
        pending = b""
        try:
            while not self.closed.is_set():
                head, pending = _read_until(client, pending, b"\r\n\r\n")
                if head is None:
                    return
                lines = head.decode("latin-1").split("\r\n")
                method = lines[0].split(" ", 1)[0]
                headers = [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:] if ":" in line]
                named = {k.lower(): v for k, v in headers}
                expect = named.get("expect", "").lower() == "100-continue"
                fault = self._draw(expect)
                if expect:
                    if fault == "cut_interim":  # closed, not reset: botocore then reads b'' forever
                        client.sendall(b"HTTP/1.1 100 Continue\r\n")
                        return client.close()
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                length = int(named.get("content-length", "0") or 0)
                if fault == "cut_request":
                    _read_exactly(client, pending, length // 2)
                    return _reset(client)
                body, pending = _read_body(client, pending, named, length)
                if fault == "slowdown":
                    client.sendall(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: "
                                   + str(len(SLOW_DOWN)).encode() + b"\r\n\r\n" + SLOW_DOWN)
                    continue
                if fault == "stall":
                    self.closed.wait(self.stall_for)
                    return client.close()
                kept = [f"{k}: {v}" for k, v in headers if k.lower() not in ("expect", "connection")]
                request = "\r\n".join([lines[0], *kept, "Connection: close", "", ""]).encode("latin-1") + body
                response = _normalized(_exchange(self.upstream, request), method)
                if fault == "cut_response":
                    client.sendall(response[:len(response) // 2])
                    return client.close()
                client.sendall(response)
        except OSError:
            pass
        finally:
            client.close()


def _reset(sock: socket.socket) -> None:
    """Close with a reset (RST), as a dropped connection does, not a polite FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _read_until(sock: socket.socket, pending: bytes, marker: bytes) -> tuple[bytes | None, bytes]:
    while marker not in pending:
        data = sock.recv(1 << 16)
        if not data:
            return None, b""
        pending += data
    head, _, rest = pending.partition(marker)
    return head, rest


def _read_exactly(sock: socket.socket, pending: bytes, n: int) -> tuple[bytes, bytes]:
    if len(pending) >= n:
        return pending[:n], pending[n:]
    out = bytearray(n)  # filled in place: a body of hundreds of MB is not copied once per receive
    out[:len(pending)] = pending
    view, filled = memoryview(out), len(pending)
    while filled < n:
        got = sock.recv_into(view[filled:], min(1 << 22, n - filled))
        if not got:
            raise ConnectionError("the client closed mid-request")
        filled += got
    return bytes(out), b""


def _read_body(sock: socket.socket, pending: bytes, named: dict, length: int) -> tuple[bytes, bytes]:
    """The request's body as it came (chunked framing kept: moto reads it), and what follows it."""
    if "chunked" not in named.get("transfer-encoding", "").lower():
        return _read_exactly(sock, pending, length)
    body = b""
    while True:
        size_line, pending = _read_until(sock, pending, b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        body += size_line + b"\r\n"
        if size == 0:
            trailer, pending = _read_until(sock, pending, b"\r\n\r\n") if not pending.startswith(b"\r\n") else (
                b"", pending[2:])
            return body + (trailer + b"\r\n\r\n" if trailer else b"\r\n"), pending
        chunk, pending = _read_exactly(sock, pending, size + 2)
        body += chunk


def _exchange(upstream: tuple[str, int], request: bytes) -> bytes:
    with socket.create_connection(upstream, timeout=60) as sock:
        sock.sendall(request)
        parts = []
        while data := sock.recv(1 << 22):
            parts.append(data)
    return b"".join(parts)


def _normalized(response: bytes, method: str) -> bytes:
    """moto's response (read to its close) as one a kept connection carries: HTTP/1.1, no `Connection: close`,
    and a Content-Length where it had neither that nor chunked framing."""
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = lines[0].split(b" ", 2)
    lines[0] = b" ".join([b"HTTP/1.1", *status[1:]])
    kept = [line for line in lines[1:] if not line.lower().startswith(b"connection:")]
    named = {line.split(b":", 1)[0].strip().lower() for line in kept}
    code = int(status[1])
    if (b"content-length" not in named and b"transfer-encoding" not in named and method != "HEAD"
            and code not in (204, 304) and code >= 200):
        kept.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join([lines[0], *kept]) + b"\r\n\r\n" + body
