"""A TCP proxy on loopback that passes traffic to an S3 server, or fails it in one of three ways on demand.

SeaweedFS cannot be told to answer 500 or to go silent for a while, so the nemesis campaign
(bench/campaigns/nemesis.py) puts this proxy between the S3 server and everything that talks to it (the
controller and the jobs); the campaign's own reads go to the server directly. Modes:

- ``pass``: bytes flow both ways unchanged;
- ``refuse``: the listening port is closed (a new connection is reset at once) and every open
  connection is cut, as when the server's process is gone;
- ``silent``: new connections are accepted and never answered, and open ones stop flowing (a hung
  server, a half-open link); when the mode ends, the stalled connections flow again;
- ``error500``: every request is answered ``500 InternalError`` with S3's XML body, and open
  connections are closed so that their next request comes through a new one.

``upload_bytes_per_s`` gives the proxy an upload link of that speed, shared by every connection
(bytes from the clients to the server; answers and downloads are not slowed), and
``download_bytes_per_s`` a download link (bytes from the server to the clients; ``downloaded_bytes``
counts them): a node's own link to a remote bucket, for bench/micro/read_once.py. On loopback a small
checkpoint's upload is over in milliseconds, before a fault fired "right after a save" can act;
over a link as slow as a spot node's to a remote bucket, it lasts seconds, and the fault lands
while the checkpoint's files are written and its manifest is not.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator

MODES = ("pass", "refuse", "silent", "error500")
_CHUNK = 1 << 16
_POLL_S = 0.2  # how often a stalled or idle connection looks at the mode again
_ERROR_500 = (
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\nConnection: close\r\n"
    b"Content-Length: 120\r\n\r\n"
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
    b"<Message>injected by the nemesis</Message></Error>".ljust(120)
)


class FaultProxy:
    """``with FaultProxy(upstream_port) as proxy:`` then ``proxy.port``; ``proxy.set_mode(...)`` at will."""

    def __init__(
        self,
        upstream_port: int,
        host: str = "127.0.0.1",
        upload_bytes_per_s: float | None = None,
        download_bytes_per_s: float | None = None,
    ) -> None:
        for name, speed in (("upload", upload_bytes_per_s), ("download", download_bytes_per_s)):
            if speed is not None and speed <= 0:
                raise ValueError(f"{name}_bytes_per_s {speed}: a speed above 0, or None for no limit")
        self.upstream = (host, upstream_port)
        self.upload = _Link(upload_bytes_per_s) if upload_bytes_per_s else None
        self.download = _Link(download_bytes_per_s) if download_bytes_per_s else None
        self.downloaded_bytes = 0  # from the server to the clients, through this proxy
        self._count_lock = threading.Lock()
        self.host = host
        self.port = 0
        self.mode = "pass"
        self._generation = 0  # bumped on every mode change: a connection made under another mode is cut
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listen()  # the port is known (and held) from here on

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FaultProxy:
        self._spawn(self._accept_loop)
        return self

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
        with self._lock:
            self.mode, self._generation = mode, self._generation + 1
            if mode == "refuse" and self._listener is not None:
                _close_listener(self._listener)
                self._listener = None
            elif mode != "refuse" and self._listener is None:
                self._listen()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            if self._listener is not None:
                _close_listener(self._listener)
                self._listener = None
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- inside ----------------------------------------------------------------------------------

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))  # the same port again after a refusal
        listener.listen(64)
        listener.settimeout(_POLL_S)
        self.port = listener.getsockname()[1]
        self._listener = listener

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            listener = self._listener
            if listener is None:  # refusing: nothing listens
                self._stopped.wait(_POLL_S)
                continue
            try:
                client, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            self._spawn(self._serve, client)

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            mode, generation = self.mode, self._generation
        with contextlib.ExitStack() as stack:
            stack.enter_context(client)
            if mode == "refuse":  # accepted just as the port closed: reset, as a closed port would
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            if mode == "error500":
                self._answer_500(client)
                return
            if mode == "silent":
                self._hold(client, generation)
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                return
            stack.enter_context(upstream)
            self._relay(client, upstream, generation)

    def _answer_500(self, client: socket.socket) -> None:
        client.settimeout(5)
        with contextlib.suppress(OSError):
            head = b""
            while b"\r\n\r\n" not in head and len(head) < _CHUNK:
                data = client.recv(_CHUNK)
                if not data:
                    return
                head += data
            client.sendall(_ERROR_500)

    def _hold(self, client: socket.socket, generation: int) -> None:
        """Accepted and never answered, until the silence ends; then the connection is closed."""
        while not self._stopped.is_set() and self._generation == generation:
            self._stopped.wait(_POLL_S)

    def _relay(self, client: socket.socket, upstream: socket.socket, generation: int) -> None:
        peers = {client: upstream, upstream: client}
        while not self._stopped.is_set():
            mode = self.mode
            if self._generation != generation and mode in ("refuse", "error500"):
                return  # cut: the client's next request finds the fault
            if mode == "silent":
                self._stopped.wait(_POLL_S)  # stalled, not cut: it flows again when the silence ends
                continue
            readable, _, _ = select.select(list(peers), [], [], _POLL_S)
            for source in readable:
                try:
                    data = source.recv(_CHUNK)
                    if not data:
                        return
                    if source is client and self.upload is not None:
                        self.upload.carry(len(data))
                    if source is upstream:
                        with self._count_lock:  # one thread per connection
                            self.downloaded_bytes += len(data)
                        if self.download is not None:
                            self.download.carry(len(data))
                    peers[source].sendall(data)
                except OSError:
                    return


class _Link:
    """A link of fixed speed that every connection shares: bytes go out one after another."""

    def __init__(self, bytes_per_s: float) -> None:
        self.bytes_per_s = bytes_per_s
        self._free_at = 0.0  # when the link has sent what it was given so far (monotonic seconds)
        self._lock = threading.Lock()

    def carry(self, size: int) -> None:
        """Wait until ``size`` bytes, queued behind every byte handed over before them, are sent."""
        with self._lock:
            done_at = max(self._free_at, time.monotonic()) + size / self.bytes_per_s
            self._free_at = done_at
        time.sleep(max(0.0, done_at - time.monotonic()))


def _close_listener(listener: socket.socket) -> None:
    """Stop listening now: shutdown wakes a thread blocked in accept(), which close() alone does not."""
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)
    listener.close()


@contextlib.contextmanager
def fault(proxy: FaultProxy, mode: str) -> Iterator[None]:
    """The proxy in ``mode`` for the body of the ``with``, then ``pass`` again."""
    proxy.set_mode(mode)
    try:
        yield
    finally:
        proxy.set_mode("pass")
