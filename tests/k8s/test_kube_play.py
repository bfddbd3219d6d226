"""The sandbox Pod of `broker k8s manifests`, run for real by `podman kube play` beside
a real `broker serve --root` on the pod's hostPath root: the request from the pod is
applied and its result read back in the pod, which has no network but lo.

`--network none` stands in for the deny-all NetworkPolicy (Podman enforces no
policies); nodeSelector means nothing to Podman. What Kubernetes itself would do
with these objects is only validated (tests/k8s/test_manifests.py), not run here.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.hosting import images, kubernetes
from broker.hosting.runtimes.podman import PodmanRuntime, observe
from tests.support import eventually

BROKER = str(Path(sys.executable).parent / "broker")
AGENT = r"""import errno, json, os, outbox
def attempt(path):
    try:
        open(path, "w").write("x")
        return "ok"
    except OSError as exc:
        return errno.errorcode[exc.errno]
r = outbox.request("files.write", {"path": "pod.txt", "content": "from the pod"}, timeout=60)
print(json.dumps({
    "net": sorted(os.listdir("/sys/class/net")),
    "uid": os.getuid(),
    "status": r["status"],
    "write_results": attempt("/results/forged.json"),
    "write_root": attempt("/etc/pod-was-here"),
    "token": os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"),
}))
"""


def broker(*args: str) -> str:
    done = subprocess.run([BROKER, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def node(tmp_path: Path, podman_runtime: PodmanRuntime) -> Iterator[dict[str, Any]]:
    """A node's root served by `broker serve --root`, as the DaemonSet serves it."""
    podman_runtime.ensure_image(images.DEFAULT_IMAGE)
    root = tmp_path / "node-root"
    (tmp_path / "exports").mkdir()
    config = tmp_path / "broker.toml"
    config.write_text(
        f'[broker]\nstate_dir = "{root}/state"\n'
        f'[integrations.files]\nroot = "{tmp_path / "exports"}"\nper_sandbox = false\n'
    )
    sandbox_id = f"kp-{uuid.uuid4().hex[:8]}"
    broker("sandbox", "prepare", sandbox_id, "--root", str(root), "--config", str(config))
    log = (tmp_path / "serve.log").open("w")
    serve = subprocess.Popen(
        [BROKER, "serve", "--config", str(config), "--root", str(root)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    pod = f"sandbox-{sandbox_id}"
    try:
        eventually(lambda: "serving" in (tmp_path / "serve.log").read_text(), 30)
        yield {
            "root": root,
            "id": sandbox_id,
            "pod": pod,
            "exports": tmp_path / "exports",
            "config": config,
            "dir": tmp_path,
        }
    finally:
        subprocess.run(["podman", "pod", "rm", "--force", "--ignore", pod], capture_output=True)
        serve.send_signal(signal.SIGINT)
        serve.wait(30)
        log.close()


def pod_yaml(node: dict[str, Any]) -> Path:
    """The Pod document of `broker k8s manifests`, its command the agent above."""
    printed = broker(
        "k8s",
        "manifests",
        "--namespace",
        "agents",
        "--image",
        "unused",
        "--root",
        str(node["root"]),
        "--sandbox",
        node["id"],
        "--sandbox-image",
        f"localhost/{images.DEFAULT_IMAGE}",
    )
    (pod,) = [d for d in yaml.safe_load_all(printed) if d and d["kind"] == "Pod"]
    pod["spec"]["containers"][0]["command"] = ["python3", "-c", AGENT]
    path = node["dir"] / "pod.yaml"
    path.write_text(kubernetes.dump(pod))
    return path


def test_the_sandbox_pod_runs_under_kube_play_and_is_answered(
    node: dict[str, Any], podman_runtime: PodmanRuntime
) -> None:
    """kube play runs the Pod as written; its request is applied by the node's broker,
    the result read back inside; only lo; results and root read-only; no token."""
    played = subprocess.run(
        ["podman", "kube", "play", "--network", "none", str(pod_yaml(node))],
        capture_output=True,
        text=True,
        timeout=120,
        env=podman_runtime.podman.env(),
    )
    assert played.returncode == 0, played.stderr
    agent = f"{node['pod']}-agent"
    code = podman_runtime.podman("wait", agent, timeout=120).strip()
    logs = podman_runtime.podman("logs", agent)
    seen = json.loads(logs.strip().splitlines()[-1])
    facts = observe(podman_runtime.podman.inspect(agent))
    box = node["root"] / "sandboxes" / node["id"]
    results = [json.loads(p.read_text()) for p in (box / "results").glob("*.json")]

    assert code == "0", logs
    assert seen == {
        "net": ["lo"],
        "uid": 10001,
        "status": "applied",
        "write_results": "EROFS",
        "write_root": "EROFS",
        "token": False,
    }
    assert (node["exports"] / "pod.txt").read_text() == "from the pod"
    assert [r["status"] for r in results if r.get("effect") == "files.write"] == ["applied"]
    assert (facts.read_only_root, facts.no_new_privileges, facts.capabilities) == (
        True,
        True,
        frozenset(),
    )
    assert facts.user == "10001:10001" and facts.privileged is False
    assert facts.binds == {
        "/outbox": (str(box / "outbox"), True),
        "/results": (str(box / "results"), False),
    }
