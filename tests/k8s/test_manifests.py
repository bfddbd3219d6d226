"""`broker k8s manifests`: every object valid against the Kubernetes schemas (strict,
offline: kubernetes-validate), and the hardening a platform team relies on is there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate as kv
import pytest
import yaml

from broker.config import load_config
from broker.errors import ConfigError

BROKER = str(Path(sys.executable).parent / "broker")
VERSIONS = ["1.29.0", kv.latest_version()]
"""The oldest release still widely run and the newest the validator knows."""


def printed(*extra: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [
            BROKER,
            "k8s",
            "manifests",
            "--namespace",
            "agents",
            "--image",
            "reg.example/broker:1",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates_strictly(version: str) -> None:
    """Each printed object is valid for the release, unknown fields refused (strict)."""
    docs = printed()

    kinds = [d["kind"] for d in docs]
    for doc in docs:
        kv.validate(doc, version, strict=True)
    assert kinds == ["Namespace", "ConfigMap", "DaemonSet", "NetworkPolicy", "NetworkPolicy", "Pod"]
    assert all(d["metadata"].get("namespace", "agents") == "agents" for d in docs)


def test_the_validator_refuses_what_a_cluster_would() -> None:
    """The check is real: a misspelt field and a wrong type are refused."""
    pod = by_kind(printed(), "Pod")[0]
    pod["spec"]["automountServiceAccountTokens"] = False
    with pytest.raises(kv.ValidationError, match="automountServiceAccountTokens"):
        kv.validate(pod, VERSIONS[-1], strict=True)
    del pod["spec"]["automountServiceAccountTokens"]
    pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = "yes"
    with pytest.raises(kv.ValidationError, match="boolean"):
        kv.validate(pod, VERSIONS[-1], strict=True)


def test_the_sandbox_pod_is_hardened_and_sees_only_its_own_directories() -> None:
    """One container (no broker sidecar), non-root, read-only root, caps dropped,
    seccomp RuntimeDefault, no token, no service env; its outbox rw, results ro."""
    pod = by_kind(printed("--sandbox", "sb-7", "--node", "node-b"), "Pod")[0]
    spec = pod["spec"]
    (agent,) = spec["containers"]
    context = agent["securityContext"]
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}

    assert "initContainers" not in spec and agent["image"] == "broker-sandbox:py"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert not (spec["hostNetwork"] or spec["hostPID"] or spec["hostIPC"])
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "node-b"}
    assert (context["runAsNonRoot"], context["runAsUser"]) == (True, 10001)
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert host_paths == {
        "outbox": "/var/lib/sandbox-broker/sandboxes/sb-7/outbox",
        "results": "/var/lib/sandbox-broker/sandboxes/sb-7/results",
    }
    assert mounts["/results"]["readOnly"] is True
    assert not mounts["/outbox"].get("readOnly", False)
    assert {e["name"]: e["value"] for e in agent["env"]}["SANDBOX_ID"] == "sb-7"


def test_sandboxes_are_denied_all_traffic_and_the_broker_only_postgres_and_dns() -> None:
    """The deny-all policy selects the sandbox pods (ingress and egress, no rule)."""
    docs = printed()
    pod = by_kind(docs, "Pod")[0]
    deny, broker = by_kind(docs, "NetworkPolicy")

    selector = deny["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert deny["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert deny["spec"]["ingress"] == [] and deny["spec"]["egress"] == []
    ports = sorted(p["port"] for rule in broker["spec"]["egress"] for p in rule["ports"])
    assert ports == [53, 53, 5432] and broker["spec"]["ingress"] == []


def test_the_daemonset_serves_its_nodes_root_as_that_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hostPath root served with --root, host id from the node name, the ledger's
    password from a Secret; its broker.toml loads as the broker would load it."""
    docs = printed("--root", "/srv/sb", "--ledger", "postgresql://broker@pg.db:5432/fleet")
    (ds,) = by_kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    toml = by_kind(docs, "ConfigMap")[0]["data"]["broker.toml"]
    (tmp_path / "broker.toml").write_text(toml)
    monkeypatch.setenv("NODE_NAME", "ip-10-0-0-7.eu-west-1.compute.internal")

    config = load_config(tmp_path / "broker.toml")

    assert container["args"][-2:] == ["--root", "/srv/sb"]
    assert {"name": "root", "hostPath": {"path": "/srv/sb", "type": "DirectoryOrCreate"}} in pod[
        "volumes"
    ]
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert {
        "name": "ledger",
        "secret": {"secretName": "broker-ledger", "defaultMode": 0o400},
    } in pod["volumes"]
    assert pod["automountServiceAccountToken"] is False
    assert config.host_id() == "ip-10-0-0-7-eu-west-1-compute-internal"
    assert config.ledger_url == "postgresql://broker@pg.db:5432/fleet"
    assert config.state_dir == Path("/srv/sb/state")


def test_a_password_in_the_ledger_url_is_refused() -> None:
    """The manifests never carry a secret: a URL with a password is one line, exit 2."""
    done = subprocess.run(
        [
            BROKER,
            "k8s",
            "manifests",
            "--namespace",
            "a",
            "--image",
            "i",
            "--ledger",
            "postgresql://broker:hunter2@pg/fleet",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 2
    assert "secrets are never written" in done.stderr
    assert "hunter2" not in done.stdout


def test_host_id_env_unset_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DaemonSet whose NODE_NAME did not arrive fails at start, naming the variable,
    rather than deriving an id of its own that another node could share."""
    monkeypatch.delenv("NODE_NAME", raising=False)
    (tmp_path / "broker.toml").write_text('[broker]\nhost_id_env = "NODE_NAME"\n')

    with pytest.raises(ConfigError, match=r"host_id_env: \$NODE_NAME is not set"):
        load_config(tmp_path / "broker.toml")
