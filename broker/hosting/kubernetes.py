"""Kubernetes manifests for a broker per node (`broker k8s manifests`).

The broker is a DaemonSet: on each node it serves ``--root`` on a hostPath directory
of that node, its host id is the node's name (downward API, [broker] host_id_env) and
its ledger the fleet's PostgreSQL (the password from a Secret). A sandbox is a Pod of
its own, never a sidecar of the broker: it shares no network namespace with anything
credentialed, and mounts only its own ``<root>/sandboxes/<id>/`` outbox (read-write)
and results (read-only), with the same hardening as on Docker and Podman. A deny-all
NetworkPolicy covers the sandboxes; the broker's allows PostgreSQL and DNS out only.

Plain objects, printed as YAML documents: kustomize patches them as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from broker.hosting.runtimes.spec import DEFAULT_LIMITS, SANDBOX_UID, memory_bytes

__all__ = ["Manifests", "dump", "manifests", "render", "sandbox_pod"]

APP = "sandbox-broker"
NAME_LABEL = "app.kubernetes.io/name"
PART = "app.kubernetes.io/component"
SANDBOX_LABEL = "sandbox-broker.io/sandbox"
CONFIG_DIR = "/etc/sandbox-broker"
SECRET_DIR = "/var/run/secrets/sandbox-broker"
Obj = dict[str, Any]


@dataclass(frozen=True)
class Manifests:
    """What the manifests are made for."""

    namespace: str
    image: str  # the broker's image
    sandbox_image: str = "broker-sandbox:py"
    root: str = "/var/lib/sandbox-broker"
    ledger: str = "postgresql://broker@postgres:5432/broker"
    sandbox_id: str = "sb-example"
    node: str = "node-a"
    command: tuple[str, ...] = ("python3", "-c", "import outbox; print('agent ready')")


def _mebi(size: str) -> str:
    """'512m' (Docker's way) as Kubernetes' '512Mi'."""
    return f"{memory_bytes(size) // 1024**2}Mi"


def _meta(m: Manifests, name: str, part: str, **labels: str) -> Obj:
    return {
        "name": name,
        "namespace": m.namespace,
        "labels": {NAME_LABEL: APP, PART: part, **labels},
    }


def _hardened(user: int, *, drop_all_but: list[str] | None = None) -> Obj:
    """A container's securityContext: read-only root, no escalation, caps dropped."""
    caps: Obj = {"drop": ["ALL"]}
    if drop_all_but:
        caps["add"] = drop_all_but
    context: Obj = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": caps,
        "runAsUser": user,
        "runAsGroup": user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if user != 0:
        context["runAsNonRoot"] = True
    return context


def _isolated_pod_spec() -> Obj:
    """What both pods share: no API token, no service env, nothing of the host's."""
    return {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
    }


def broker_config(m: Manifests) -> Obj:
    toml = (
        "[broker]\n"
        f'state_dir = "{m.root}/state"\n'
        'host_id_env = "NODE_NAME"\n'
        f'ledger = "{m.ledger}"\n'
        f'ledger_password_file = "{SECRET_DIR}/ledger-password"\n'
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(m, "broker-config", "broker"),
        "data": {"broker.toml": toml},
    }


def daemonset(m: Manifests) -> Obj:
    """The broker on every node, serving <root>/sandboxes/* of that node."""
    labels = {NAME_LABEL: APP, PART: "broker"}
    container = {
        "name": "broker",
        "image": m.image,
        "args": ["broker", "serve", "--config", f"{CONFIG_DIR}/broker.toml", "--root", m.root],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "HOME", "value": "/tmp"},
        ],
        # root without the rest of root's powers: it hands each outbox to uid 10001
        "securityContext": _hardened(0, drop_all_but=["CHOWN", "DAC_OVERRIDE", "FOWNER"]),
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"cpu": "1", "memory": "1Gi"},
        },
        "volumeMounts": [
            {"name": "root", "mountPath": m.root},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "ledger", "mountPath": SECRET_DIR, "readOnly": True},
            {"name": "broker-tmp", "mountPath": "/tmp"},
        ],
    }
    spec = {
        **_isolated_pod_spec(),
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [
            {"name": "root", "hostPath": {"path": m.root, "type": "DirectoryOrCreate"}},
            {"name": "config", "configMap": {"name": "broker-config"}},
            {"name": "ledger", "secret": {"secretName": "broker-ledger", "defaultMode": 0o400}},
            {"name": "broker-tmp", "emptyDir": {"sizeLimit": "64Mi"}},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta(m, "broker", "broker"),
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


def _tmp_volume(m: Manifests) -> str:
    """The sandbox's /tmp volume, named for the sandbox: Kubernetes keeps an emptyDir to
    its pod whatever its name, but `podman kube play` makes a named volume of it, which
    pods using the same name would share."""
    return re.sub(r"[^a-z0-9-]", "-", f"tmp-{m.sandbox_id}".lower())[:63].rstrip("-")


def _agent(m: Manifests) -> Obj:
    """The sandbox's one container: the agent image, hardened, its two mounts and /tmp."""
    limits = DEFAULT_LIMITS
    return {
        "name": "agent",
        "image": m.sandbox_image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(m.command),
        "env": [
            {"name": "OUTBOX_DIR", "value": "/outbox"},
            {"name": "RESULTS_DIR", "value": "/results"},
            {"name": "SANDBOX_ID", "value": m.sandbox_id},
        ],
        "securityContext": _hardened(SANDBOX_UID),
        "resources": {
            "requests": {"cpu": "100m", "memory": "64Mi"},
            "limits": {
                "cpu": f"{limits.nano_cpus // 1_000_000}m",
                "memory": _mebi(limits.memory),
            },
        },
        "volumeMounts": [
            {"name": "outbox", "mountPath": "/outbox"},
            {"name": "results", "mountPath": "/results", "readOnly": True},
            {"name": _tmp_volume(m), "mountPath": "/tmp"},
        ],
    }


def sandbox_pod(m: Manifests) -> Obj:
    """One sandbox: its own outbox (rw) and results (ro) of the node's root, nothing else."""
    box = f"{m.root}/sandboxes/{m.sandbox_id}"
    spec = {
        **_isolated_pod_spec(),
        "restartPolicy": "Never",
        "nodeSelector": {"kubernetes.io/hostname": m.node},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SANDBOX_UID,
            "runAsGroup": SANDBOX_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_agent(m)],
        "volumes": [
            {"name": "outbox", "hostPath": {"path": f"{box}/outbox", "type": "Directory"}},
            {"name": "results", "hostPath": {"path": f"{box}/results", "type": "Directory"}},
            {
                "name": _tmp_volume(m),
                "emptyDir": {"medium": "Memory", "sizeLimit": _mebi(DEFAULT_LIMITS.tmpfs_size)},
            },
        ],
    }
    name = f"sandbox-{m.sandbox_id}".lower().replace("_", "-").replace(".", "-")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(m, name, "sandbox", **{SANDBOX_LABEL: m.sandbox_id}),
        "spec": spec,
    }


def _policy(m: Manifests, name: str, part: str, egress: list[Obj]) -> Obj:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(m, name, part),
        "spec": {
            "podSelector": {"matchLabels": {NAME_LABEL: APP, PART: part}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }


def policies(m: Manifests) -> list[Obj]:
    """Sandboxes: nothing in, nothing out. The broker: PostgreSQL and DNS out, nothing in."""
    dns = {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    postgres = {"ports": [{"protocol": "TCP", "port": 5432}]}
    return [
        _policy(m, "sandbox-deny-all", "sandbox", []),
        _policy(m, "broker-egress", "broker", [postgres, dns]),
    ]


def manifests(m: Manifests) -> list[Obj]:
    """Every object, in the order `kubectl apply` wants them."""
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": m.namespace, "labels": {NAME_LABEL: APP}},
    }
    return [namespace, broker_config(m), daemonset(m), *policies(m), sandbox_pod(m)]


HEADER = """\
# sandbox-broker on Kubernetes: a broker per node (DaemonSet) and one sandbox Pod.
# Before applying, create the ledger's password (never in these files):
#   kubectl -n {ns} create secret generic broker-ledger --from-literal=ledger-password=…
# The sandbox Pod is a template: each sandbox gets its own id, its node's name, and
# its directories made first by that node's broker:
#   kubectl -n {ns} exec <broker pod on the node> -- broker sandbox prepare <id> --root {root}
# See docs/kubernetes.md (threat model, metadata-server blocking, sizing).
"""


def render(objects: list[Obj], m: Manifests) -> str:
    """YAML documents, separated by ---, under a header saying what to do first."""
    return HEADER.format(ns=m.namespace, root=m.root) + "---\n" + "---\n".join(map(dump, objects))


def dump(obj: Obj) -> str:
    """One object as YAML that Go's parsers (kubectl, podman kube play) read back:
    multi-line strings as blocks, no anchors."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True  # plain objects: no &id001 anchors for kustomize to trip on

    def text(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
        style = "|" if "\n" in data else None  # broker.toml, a script: as written
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump(obj, Dumper=Dumper, sort_keys=False)
