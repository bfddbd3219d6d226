"""The sandbox Pod of `broker k8s manifests`, run for real by `podman kube play` beside
a real `broker serve --root` on the pod's hostPath root: the request from the pod is
applied and its result read back in the pod, which has no network but lo.

`--network none` stands in for the deny-all NetworkPolicy (Podman enforces no
policies); nodeSelector means nothing to Podman. What Kubernetes itself would do
with these objects is only validated (tests/k8s/test_manifests.py), not run here.

The DaemonSet's container spec runs too, as a Pod (Podman 4.3 plays no DaemonSet):
the broker in a pod of its own, with the DaemonSet's security context, serving the
sandbox pod through the hostPath root alone.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import sysconfig
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.hosting import images, kubernetes
from broker.hosting.runtimes.podman import PodmanContainer, PodmanRuntime, observe
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
    "tmp": attempt("/tmp/agent-was-here"),
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
        "tmp": "ok",
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


REPO = Path(__file__).resolve().parents[2]
BROKER_PROBE = """import json, os
status = open("/proc/self/status").read()
print(json.dumps({"caps": status.split("CapEff:")[1].split()[0], "uid": os.getuid(),
    "tmp": os.listdir("/tmp"), "net": sorted(os.listdir("/sys/class/net")),
    "root_ro": bool(os.statvfs("/").f_flag & os.ST_RDONLY)}))"""


def broker_pod_yaml(root: Path, exports: Path, at: Path) -> Path:
    """The DaemonSet's ConfigMap and pod template as a Pod, with only what this machine
    cannot give it changed: SQLite instead of the fleet's PostgreSQL (so no Secret),
    NODE_NAME written out (no downward API), and, there being no broker image to pull
    or build offline, Debian's base with this checkout and its venv mounted read-only."""
    printed = broker(
        "k8s",
        "manifests",
        "--namespace",
        "agents",
        "--image",
        f"localhost/{images.FALLBACK_BASE}",
        "--root",
        str(root),
        "--sandbox",
        "unused",
    )
    docs = [d for d in yaml.safe_load_all(printed) if d]
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    toml = [line for line in config["data"]["broker.toml"].splitlines() if "ledger" not in line]
    toml += ["[integrations.files]", f'root = "{exports}"', "per_sandbox = false", ""]
    config["data"]["broker.toml"] = "\n".join(toml)
    spec = ds["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    site = sysconfig.get_paths()["purelib"]
    container["args"] = ["python3", "-m", *container["args"]]
    container["env"] = [e for e in container["env"] if e["name"] != "NODE_NAME"] + [
        {"name": "NODE_NAME", "value": "node-a"},
        {"name": "PYTHONPATH", "value": f"{site}:{REPO}"},
    ]
    code = [
        {"name": "site", "mountPath": site, "readOnly": True},
        {"name": "repo", "mountPath": str(REPO), "readOnly": True},
    ]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "ledger"]
    container["volumeMounts"] += code
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "ledger"] + [
        {"name": "site", "hostPath": {"path": site, "type": "Directory"}},
        {"name": "repo", "hostPath": {"path": str(REPO), "type": "Directory"}},
    ]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "broker-node-a", "labels": labels},
        "spec": spec,
    }
    path = at / "broker-pod.yaml"
    path.write_text(kubernetes.dump(config) + "---\n" + kubernetes.dump(pod))
    return path


def play(podman_runtime: PodmanRuntime, path: Path) -> None:
    played = subprocess.run(
        ["podman", "kube", "play", "--network", "none", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=podman_runtime.podman.env(),
    )
    assert played.returncode == 0, played.stderr


def test_the_daemonsets_container_serves_the_sandbox_pod(
    tmp_path: Path, podman_runtime: PodmanRuntime
) -> None:
    """Two pods sharing only the node's directory: the broker (the DaemonSet's spec:
    root with CHOWN, DAC_OVERRIDE, FOWNER only, read-only root) prepares the sandbox's
    directories and applies its request; each pod has only lo and its own /tmp."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the broker pod runs this venv on Debian 12's Python 3.11")
    podman_runtime.ensure_image(images.DEFAULT_IMAGE)
    if not podman_runtime.podman.exists("image", images.FALLBACK_BASE):
        pytest.skip(
            f"{images.FALLBACK_BASE} is not in Podman's store (the agent image "
            "was built on another base)"
        )
    root, exports = tmp_path / "node-root", tmp_path / "node-root" / "exports"
    exports.mkdir(parents=True)
    node = {"root": root, "id": f"ds-{uuid.uuid4().hex[:8]}", "dir": tmp_path}
    pods = ["broker-node-a", f"sandbox-{node['id']}"]
    podman = podman_runtime.podman
    try:
        play(podman_runtime, broker_pod_yaml(root, exports, tmp_path))
        logs = PodmanContainer(podman, "broker-node-a-broker").logs  # stdout and stderr
        eventually(lambda: b"serving" in logs(), 60)
        in_broker = ["exec", "broker-node-a-broker", "python3"]
        podman(
            *in_broker,
            "-m",
            "broker",
            "sandbox",
            "prepare",
            node["id"],
            "--root",
            str(root),
            "--config",
            "/etc/sandbox-broker/broker.toml",
        )
        play(podman_runtime, pod_yaml(node))
        agent = f"sandbox-{node['id']}-agent"
        code = podman("wait", agent, timeout=120).strip()
        seen = json.loads(podman("logs", agent).strip().splitlines()[-1])
        powers = json.loads(podman(*in_broker, "-c", BROKER_PROBE))
        served = logs().decode()
    finally:
        for pod in pods:
            subprocess.run(
                ["podman", "pod", "rm", "--force", "--ignore", pod],
                capture_output=True,
                env=podman_runtime.podman.env(),
            )
        # kube play made a named volume of the ConfigMap: gone, so no later run reads it
        subprocess.run(
            ["podman", "volume", "rm", "--force", "broker-config"],
            capture_output=True,
            env=podman_runtime.podman.env(),
        )

    assert code == "0", seen
    assert (seen["status"], seen["net"], seen["write_results"]) == ("applied", ["lo"], "EROFS")
    assert (exports / "pod.txt").read_text() == "from the pod"
    assert f"applied  {node['id']}/" in served
    assert (int(powers["caps"], 16), powers["uid"]) == (0b1011, 0)  # CHOWN, DAC_OVERRIDE, FOWNER
    assert powers["net"] == ["lo"] and powers["root_ro"] is True
    assert "agent-was-here" not in powers["tmp"]  # the sandbox's /tmp is its own
