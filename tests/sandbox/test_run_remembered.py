"""`broker run` with inputs whose check passed before (broker.cli.passed), on the real
engine: started without checking again (its warnings said all the same), checked first
again once anything it read changed, and stopped with the check's one line, its sandbox
removed, if the check it put off fails when a broker is built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from broker.cli import passed
from broker.config import load_config
from broker.hosting.runtimes.docker import DockerRuntime

pytestmark = pytest.mark.docker

BROKER = str(Path(sys.executable).parent / "broker")
# broker.cli.run's main, then the modules it loaded
WRAPPED = (
    "import sys\nfrom broker.cli.run import main\ncode = main(sys.argv[2:])\n"
    "open(sys.argv[1], 'w').write('\\n'.join(sorted(sys.modules)))\nsys.exit(code)\n"
)
SHADOWED = (
    '[[rules]]\neffect = "files.*"\naction = "auto"\n'
    '[[rules]]\neffect = "files.write"\naction = "deny"\n'
)
CHECKED_BY_THE_CHECK = ("broker.registry", "broker.policy.ruleset", "broker.audit.checkpoints")
AGENT = """
import outbox
r = outbox.request("files.write", {"path": "out.txt", "content": "x"}, timeout=60)
print("AGENT", r["status"])
"""


@pytest.fixture
def config(tmp_path: Path, agent_image: str) -> Path:
    """broker.toml with a files root and a policy whose second rule is shadowed."""
    (tmp_path / "exports").mkdir()
    (tmp_path / "policy.toml").write_text(SHADOWED)
    path = tmp_path / "broker.toml"
    path.write_text(
        f'[broker]\nstate_dir = "state"\npolicy = "policy.toml"\n'
        f'[integrations.files]\nroot = "{tmp_path / "exports"}"\nper_sandbox = false\n'
    )
    return path


def run(config: Path, modules: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WRAPPED, str(modules), "--config", str(config), "--", *command],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def containers(state: Path) -> list[object]:
    return [
        c
        for c in DockerRuntime().leftovers()
        if any(m.get("Source", "").startswith(f"{state}/") for m in c.attrs.get("Mounts", []))
    ]


def test_a_second_run_of_the_same_inputs_starts_without_checking_again(
    config: Path, tmp_path: Path
) -> None:
    """The first run checks (the registry, the policy) and remembers; the second loads
    none of the check's modules and still prints the policy's warning."""
    modules = tmp_path / "modules.txt"
    first = run(config, modules, "true")
    assert first.returncode == 0, first.stderr
    assert "warning: " in first.stderr and "never decides" in first.stderr
    assert set(CHECKED_BY_THE_CHECK) <= set(modules.read_text().split())
    second = run(config, modules, "true")
    assert second.returncode == 0, second.stderr
    assert "exited with 0: no requests" in second.stderr
    warning = next(line for line in first.stderr.splitlines() if "never decides" in line)
    assert warning in second.stderr.splitlines()
    assert not set(CHECKED_BY_THE_CHECK) & set(modules.read_text().split())


def test_a_run_whose_agent_writes_checks_then_and_is_applied(config: Path, tmp_path: Path) -> None:
    """Inputs that passed before: the check comes when the agent first writes, and the
    request is decided by the policy it loads (the first rule: applied)."""
    modules = tmp_path / "modules.txt"
    assert run(config, modules, "true").returncode == 0
    done = run(config, modules, "python3", "-c", AGENT)
    assert done.returncode == 0, done.stderr
    assert "AGENT applied" in done.stderr
    assert (tmp_path / "exports" / "out.txt").read_text() == "x"


def test_changed_inputs_are_checked_before_a_sandbox_exists(config: Path, tmp_path: Path) -> None:
    """broker.toml changed after a pass: the fault is found first, one line, exit 2,
    and no sandbox is made."""
    modules = tmp_path / "modules.txt"
    assert run(config, modules, "true").returncode == 0
    sandboxes = tmp_path / "state" / "sandboxes"
    before = set(sandboxes.iterdir())
    config.write_text(config.read_text() + "[integrations.nosuch]\nx = 1\n")
    done = run(config, modules, "true")
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and "nosuch" in line, line
    assert set(sandboxes.iterdir()) == before


def test_a_check_put_off_that_fails_stops_the_run_and_removes_its_sandbox(
    config: Path, tmp_path: Path, engine: docker.DockerClient
) -> None:
    """A check that would fail, remembered as passed (what a change the key cannot see
    would do): the agent's first write builds the broker, the check fails, the run
    ends with its one line and exit 2, nothing is applied, the container is gone, and
    the next run checks before it starts."""
    config.write_text(config.read_text() + "[integrations.nosuch]\nx = 1\n")
    cfg = load_config(config)
    passed.remember(cfg, [])
    modules = tmp_path / "modules.txt"
    done = run(config, modules, "python3", "-c", AGENT)
    assert done.returncode == 2, done.stderr
    assert "running python3" in done.stderr  # started before the check, as remembered
    assert done.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "nosuch" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "exports" / "out.txt").exists()
    assert containers(tmp_path / "state") == []
    assert passed.key(cfg) not in json.loads((tmp_path / "state" / passed.FILE).read_text())


TOKEN = "tok_run_logs_5e3a9c"
# a file whose name is no request's, the config's secret in it (not in the command line)
BAD_NAME = "open('/outbox/' + 'tok_run_' + 'logs_5e3a9c' + '.txt', 'w').write('x')"


def test_a_run_logs_in_its_format_with_its_secrets_masked_checked_now_or_before(
    tmp_path: Path, config: Path
) -> None:
    """The log format and the masks are installed before anything logs: before the
    check on a first run, on the serving thread on a run whose inputs passed before.
    Both runs' one warning (a file in the outbox whose name is no request's, the name
    holding the config's secret) is a JSON line with the secret masked."""
    config.write_text(
        config.read_text() + '[integrations.github]\ntoken_env = "TEST_BROKER_RUN_TOKEN"\n'
    )
    env = {**os.environ, "TEST_BROKER_RUN_TOKEN": TOKEN}
    argv = [BROKER, "run", "--config", str(config), "--log-format", "json"]
    for _ in ("checked now", "passed before"):
        done = subprocess.run(
            [*argv, "--", "python3", "-c", BAD_NAME],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        logged = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
        assert any("not a request name" in entry["message"] for entry in logged), done.stderr
        assert TOKEN not in done.stderr
