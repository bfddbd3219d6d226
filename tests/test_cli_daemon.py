"""`broker serve` and `broker run` start the same way (broker.cli.daemon): the same fault
gives both the same one line before anything is served, and a signal stops serve and
the web inbox it started."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import TLS, Serving, assert_one_line_error, run_broker

# name → (extra options, broker.toml, policy file or None, words the line must hold)
FAULTS: dict[str, tuple[list[str], str, str | None, list[str]]] = {
    "listen-beyond-loopback": (["--listen", "0.0.0.0:0"], "", None, ["not a loopback address"]),
    "listen-not-host-port": (["--listen", "8700"], "", None, ["expected HOST:PORT"]),
    "listen-port-taken": (["--listen", "127.0.0.1:{busy}"], "", None, ["cannot listen"]),
    "notify-not-http": (
        [],
        '[[notify.webhooks]]\nurl = "ftp://127.0.0.1/x"\n',
        None,
        ["notify.webhooks[0].url", "http(s)"],
    ),
    "notify-unknown-key": ([], "[notify]\nwebhook = 1\n", None, ["notify.webhook"]),
    "policy-bad-key": (
        [],
        "",
        '[[rules]]\neffect = "a.b"\naction = "auto"\napprovals = 2\n',
        ["rules[0].approvals"],
    ),
}


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port something is already listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("fault", list(FAULTS))
def test_serve_and_run_refuse_the_same_fault_with_the_same_line(
    home: Path, tmp_path: Path, busy_port: int, fault: str
) -> None:
    """A bad --listen, [notify] or policy stops serve and run alike: one line, nothing served."""
    options, toml, policy, words = FAULTS[fault]
    config = tmp_path / "broker.toml"
    config.write_text(f'[broker]\nstate_dir = "state"\n{toml}')
    args = ["--config", str(config), *(o.format(busy=busy_port) for o in options)]
    if policy is not None:
        (tmp_path / "policy.toml").write_text(policy)
        args += ["--policy", str(tmp_path / "policy.toml")]
    served = run_broker("serve", *args, home=home)
    ran = run_broker("run", *args, "--name", "never", "--", "true", home=home)
    line = assert_one_line_error(served, *words)
    assert assert_one_line_error(ran, *words) == line
    assert line.startswith("error: ")
    assert (served.returncode, ran.returncode) == (2, 2)
    assert not (tmp_path / "state" / "sandboxes" / "never").exists(), "run made a sandbox"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_serve_and_its_web_inbox(home: Path, tmp_path: Path, signum: int) -> None:
    """serve says what it serves, then where the inbox is; a signal ends both, exit 0."""
    state = tmp_path / "state"
    serving = Serving(home, "--state", str(state), "--listen", "127.0.0.1:0")
    try:
        banner = serving.line_with("broker: serving sandboxes")
        url = serving.line_with("broker: web inbox on ").rsplit(" ", 1)[1]
        assert banner == f"broker: serving sandboxes: none yet; state in {state}; Ctrl-C stops"
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(url, timeout=10, verify=TLS).status_code < 500
        code = serving.stop(signum)
    finally:
        serving.close()
    assert code == 0, serving.seen
    assert "Traceback" not in "".join(serving.seen)
    with pytest.raises(httpx.ConnectError):
        httpx.get(url, timeout=5, verify=TLS)


def test_importing_the_cli_loads_no_heavy_library() -> None:
    """The command table (every --help, every one-line error) loads no web, cloud or
    Docker library and not the pipeline: those are imported by the commands using them."""
    heavy = ["fastapi", "uvicorn", "starlette", "boto3", "botocore", "github", "docker", "httpx"]
    heavy += [
        "broker.loop.pipeline",
        "broker.web.server",
        "broker.approval.notify",
        "broker.hosting.runner",
    ]
    code = f"import sys, broker.cli.commands; print([m for m in {heavy!r} if m in sys.modules])"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert proc.stdout.strip() == "[]"


def test_broker_run_starts_without_typer_rich_or_docker_py(home: Path, tmp_path: Path) -> None:
    """What every agent's start pays for: up to the container's start, `broker run`
    imports no CLI framework and no docker-py (the pipeline is built on a thread of its
    own meanwhile); once its inputs' check has passed, not dataclasses (with inspect),
    tempfile (with shutil and random) nor hashlib (with OpenSSL) either, each
    milliseconds of every cold start. Shown by stopping real runs where they would
    create the container."""
    probe = (
        "import sys, runpy; sys.argv = ['broker', *sys.argv[1:]]\n"
        "import broker.hosting.runtimes.docker as d\n"
        "def refuse(self, spec):\n"
        "    mods = ('typer', 'rich', 'click', 'docker', 'requests', 'dataclasses',\n"
        "            'inspect', 'tempfile', 'shutil', 'hashlib')\n"
        "    print('loaded:', [m for m in mods if m in sys.modules])\n"
        "    raise SystemExit(0)\n"
        "d.DockerRuntime.start = refuse\n"
        "d.DockerRuntime.ensure_image = lambda self, tag, **kw: tag\n"
        "from broker.cli import main\n"
        "main()\n"
    )
    state = tmp_path / "state"

    def loaded() -> str:
        done = subprocess.run(
            [sys.executable, "-c", probe, "run", "--state", str(state), "--", "true"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "HOME": str(home)},
        )
        assert done.stdout.startswith("loaded: "), done.stdout + done.stderr
        return done.stdout

    first = loaded()  # checks its inputs first: the check may use what it likes
    assert not any(f"'{m}'" in first for m in ("typer", "rich", "click", "docker", "requests"))
    assert loaded().strip() == "loaded: []"
