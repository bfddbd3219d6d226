"""The hardening is proven on each created container before it starts: a runtime that
cannot show a property (or shows it wrong) does not start the sandbox."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from broker.errors import SandboxError
from broker.hosting import images, sandbox
from broker.hosting.runtimes.base import Runtime
from broker.hosting.runtimes.docker import DockerRuntime
from broker.hosting.runtimes.podman import Podman, PodmanRuntime
from broker.hosting.runtimes.proof import Observed, prove
from broker.hosting.runtimes.spec import SandboxSpec, sandbox_spec
from tests.sandbox.conftest import ROOTLESS_USER, prepare, state_base

PATHS = sandbox.SandboxPaths("p1", Path("/s/p1"), Path("/s/p1/outbox"), Path("/s/p1/results"))
SPEC = sandbox_spec(PATHS, "img", ["true"])
GOOD = Observed(
    network="none",
    read_only_root=True,
    capabilities=frozenset(),
    no_new_privileges=True,
    privileged=False,
    user="10001:10001",
    pids=256,
    memory=512 * 1024**2,
    nano_cpus=1_000_000_000,
    binds={"/outbox": ("/s/p1/outbox", True), "/results": ("/s/p1/results", False)},
)


def test_a_container_showing_every_property_is_proven() -> None:
    """All ten properties as the spec asks: no error."""
    prove(SPEC, GOOD, "test")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"network": "bridge"}, "network is 'bridge'"),
        ({"read_only_root": False}, "root file system is writable"),
        ({"capabilities": frozenset({"CAP_NET_RAW"})}, "capabilities kept: CAP_NET_RAW"),
        ({"no_new_privileges": False}, "no-new-privileges is not set"),
        ({"privileged": True}, "privileged"),
        ({"user": "0:0"}, "user is '0:0'"),
        ({"pids": 0}, "pids limit is 0"),
        ({"memory": 0}, "memory is 0"),
        (
            {"binds": {"/outbox": ("/s/p1/outbox", True), "/results": ("/s/p1/results", True)}},
            "mounts differ at /results",
        ),
        ({"binds": {**GOOD.binds, "/": ("/", False)}}, "mounts differ at /"),  # type: ignore[dict-item]
    ],
)
def test_a_contradicted_property_is_named(change: dict[str, Any], said: str) -> None:
    """Each property shown wrong is named in the refusal."""
    seen = Observed(**{**GOOD._asdict(), **change})

    with pytest.raises(SandboxError, match="did not prove its hardening") as caught:
        prove(SPEC, seen, "test")

    assert said in str(caught.value)


def test_a_property_the_runtime_cannot_show_is_a_refusal() -> None:
    """A property the inspect does not report (None) is not assumed to hold."""
    seen = Observed(**{**GOOD._asdict(), "read_only_root": None})

    with pytest.raises(SandboxError, match="read-only root: test cannot prove it"):
        prove(SPEC, seen, "test")


class Forgetful:
    """Wraps a real runtime's inspect so that one key is missing from what it reports."""

    def __init__(self, section: str | None, key: str) -> None:
        self.section, self.key = section, key

    def __call__(self, attrs: Mapping[str, Any]) -> dict[str, Any]:
        doctored = {k: (dict(v) if isinstance(v, dict) else v) for k, v in attrs.items()}
        (doctored[self.section] if self.section else doctored).pop(self.key)
        return doctored


def forgetful(runtime: Runtime, forget: Forgetful) -> Runtime:
    """The same runtime whose inspect lacks one property."""
    if isinstance(runtime, DockerRuntime):

        class ForgetfulDocker(DockerRuntime):
            def inspect(self, container: Any) -> dict[str, Any]:
                return forget(super().inspect(container))

        return ForgetfulDocker(runtime.client)
    assert isinstance(runtime, PodmanRuntime)

    class ForgetfulPodman(PodmanRuntime):
        def inspect(self, container: Any) -> dict[str, Any]:
            return forget(super().inspect(container))

    return ForgetfulPodman(runtime.podman)


@pytest.mark.docker
@pytest.mark.parametrize(
    ("section", "key", "said"),
    [
        ("HostConfig", "ReadonlyRootfs", "read-only root"),
        ("HostConfig", "NetworkMode", "network"),
        (None, "Mounts", "outbox rw, results ro, nothing else"),
    ],
)
def test_a_runtime_whose_inspect_lacks_a_property_refuses_to_start(
    runtime: Runtime, tmp_path: Path, section: str | None, key: str, said: str
) -> None:
    """On a real runtime whose inspect lacks one property, the sandbox is not started
    and the created container is removed."""
    doctored = forgetful(runtime, Forgetful(section, key))
    with state_base(runtime, tmp_path) as base:
        paths = prepare(runtime, base, f"forget-{uuid.uuid4().hex[:8]}")
        spec = sandbox_spec(paths, images.DEFAULT_IMAGE, ["sh", "-c", "echo ran > /outbox/ran"])

        with pytest.raises(SandboxError, match=f"{said}: .* cannot prove it"):
            doctored.start(spec)

        assert not (paths.outbox / "ran").exists()
    mine = [c for c in runtime.leftovers() if c.labels.get(sandbox.LABEL) == paths.sandbox_id]
    assert mine == []


def _spec(tmp: Path, runtime: Runtime) -> SandboxSpec:
    paths = prepare(runtime, tmp, f"rl-{uuid.uuid4().hex[:8]}")
    return sandbox_spec(paths, images.DEFAULT_IMAGE, ["true"])


def test_rootless_podman_on_cgroup_v1_refuses_for_want_of_limits(tmp_path: Path) -> None:
    """Rootless Podman ignores limits on cgroup v1 (it prints so, and its inspect shows
    them as 0): the proof refuses the sandbox, naming the limits, rather than run it
    unlimited."""
    try:
        rootless = PodmanRuntime(Podman(ROOTLESS_USER))
    except (SandboxError, KeyError) as exc:
        pytest.skip(f"no rootless Podman user {ROOTLESS_USER} ({exc})")
    if rootless.cgroups == "v2":
        pytest.skip("cgroup v2 here: rootless Podman applies limits (the other tests run it)")
    home = Path(f"~{ROOTLESS_USER}").expanduser()
    state = home / f"state-{uuid.uuid4().hex[:8]}"
    rootless.podman("unshare", "true")  # its user namespace is set up
    import shutil
    import subprocess

    subprocess.run(["runuser", "-u", ROOTLESS_USER, "--", "mkdir", str(state)], check=True)
    try:
        spec = _spec(state, rootless)
        rootless.ensure_image(images.DEFAULT_IMAGE, log=lambda _: None)
        with pytest.raises(SandboxError) as caught:
            rootless.start(spec)
        said = str(caught.value)
        assert "podman rootless did not prove its hardening" in said
        assert "pids limit: pids limit is 0, not 256" in said
        assert "memory limit: memory is 0, not 536870912" in said
        assert not [
            c for c in rootless.leftovers() if c.labels.get(sandbox.LABEL) == spec.sandbox_id
        ]
    finally:
        shutil.rmtree(state, ignore_errors=True)
