"""The Engine API client (broker.hosting.runtimes.engine): a wait and a followed log
stream last as long as the agent does, and the HTTP/1.1 it reads is read exactly.

The first test runs on the real engine. The others serve the response shapes the
engine uses (chunked, Content-Length, to the close, 204) and some it must never be
trusted to send, from a Unix socket of the test's own: the point is the reader's
handling of each shape, which the real engine cannot be made to produce on demand."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.errors import SandboxError
from broker.hosting.runtimes.engine import EngineClient, EngineContainer, EngineError


def test_a_wait_and_a_silent_log_stream_outlast_the_clients_timeout(agent_image: str) -> None:
    """A client whose calls time out after 0.5 s still waits 2 s for an agent's end and
    gets the line it printed after 1.5 s of silence (an agent quiet for longer than the
    call timeout, 60 s by default, used to end `broker run` with a traceback)."""
    client = EngineClient(timeout=0.5)
    made = client.call(
        "POST",
        "/containers/create",
        {
            "Image": agent_image,
            "Entrypoint": ["sh", "-c", "sleep 1.5; echo late; sleep 0.5; exit 3"],
            "HostConfig": {"NetworkMode": "none"},
        },
        query={"name": f"broker-test-engine-{uuid.uuid4().hex[:8]}"},
    )
    container = EngineContainer(client, made)
    try:
        client.call("POST", f"/containers/{container.id}/start")
        lines: list[bytes] = []
        reader = threading.Thread(
            target=lambda: lines.extend(container.logs(stream=True, follow=True)), daemon=True
        )
        reader.start()
        assert container.wait() == {"StatusCode": 3, "Error": None}
        reader.join(10)
        assert b"".join(lines) == b"late\n"
    finally:
        client.call("DELETE", f"/containers/{container.id}", query={"force": 1})


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[tuple[EngineClient, list[bytes]]]:
    """A one-shot server on a Unix socket: it records each request and sends the next of
    the responses queued in the list it yields, then closes."""
    path = str(tmp_path / "engine.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    replies: list[bytes] = []
    requests: list[bytes] = []

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                requests.append(data)
                conn.sendall(replies.pop(0))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    client = EngineClient(path, timeout=5)
    client.requests = requests  # type: ignore[attr-defined]
    yield client, replies
    server.close()


def test_chunked_content_length_and_to_the_close(
    serve: tuple[EngineClient, list[bytes]],
) -> None:
    client, replies = serve
    replies.append(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'5\r\n{"Sta\r\nf;ext=1\r\ntusCode": 0, "E\r\n9\r\nrror": 1}\r\n0\r\nX-T: 1\r\n\r\n'
    )
    replies.append(b'HTTP/1.1 201 Created\r\nContent-Length: 10\r\n\r\n{"Id": 1}\n')
    replies.append(b"HTTP/1.0 200 OK\r\n\r\n[1, 2, 3]")
    replies.append(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
    assert client.call("POST", "/w") == {"StatusCode": 0, "Error": 1}
    assert client.call("POST", "/c", {"x": "é"}) == {"Id": 1}
    assert client.call("GET", "/l") == [1, 2, 3]
    assert client.call("DELETE", "/d", query={"force": 1}) is None
    sent = client.requests  # type: ignore[attr-defined]
    assert sent[1].startswith(b"POST /c HTTP/1.1\r\n")
    assert b"Content-Length: 15\r\n" in sent[1] and sent[1].endswith(b'{"x": "\\u00e9"}')
    assert sent[3].startswith(b"DELETE /d?force=1 HTTP/1.1\r\n")


def test_a_log_stream_of_frames_across_chunks(serve: tuple[EngineClient, list[bytes]]) -> None:
    """Docker's multiplexed frames (8-byte header, then the payload), split across
    chunks at arbitrary points, come out whole and in order."""
    client, replies = serve
    body = b"\x01\x00\x00\x00\x00\x00\x00\x03hi\n\x02\x00\x00\x00\x00\x00\x00\x04err\n"
    chunks = [body[:5], body[5:13], body[13:]]
    replies.append(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks)
        + b"0\r\n\r\n"
    )
    assert list(client.frames("/logs", {"follow": 1})) == [(1, b"hi\n"), (2, b"err\n")]


@pytest.mark.parametrize(
    ("reply", "status", "says"),
    [
        (
            b'HTTP/1.1 404 Not Found\r\nContent-Length: 29\r\n\r\n{"message":"No such image"}\n\n',
            404,
            "No such image",
        ),
        (b"HTTP/1.1 500 Internal\r\nContent-Length: 4\r\n\r\noops", 500, "oops"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", 0, "as its status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{}", 0, "before its Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", 0, "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 0, "chunk size"),
        (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n", 0, "ended before its headers"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}}\r\n0\r\n\r\n",
            0,
            "longer",
        ),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", 0, "header"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nnope!", 0, "not JSON"),
    ],
)
def test_what_it_cannot_read_is_one_engine_error(
    serve: tuple[EngineClient, list[bytes]], reply: bytes, status: int, says: str
) -> None:
    """An error status keeps the engine's message; a response that is not HTTP, is cut
    short or lies about its length is an EngineError (a SandboxError: the CLI's one
    line), never a guess or a hang."""
    client, replies = serve
    replies.append(reply)
    with pytest.raises(EngineError) as raised:
        client.call("GET", "/x")
    assert raised.value.status == status and says in str(raised.value)
    assert isinstance(raised.value, SandboxError)


def test_no_engine_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="does not answer"):
        EngineClient(str(tmp_path / "absent.sock")).call("GET", "/_ping")
