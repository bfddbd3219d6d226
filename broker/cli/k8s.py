"""`broker k8s manifests`: the Kubernetes objects for a broker per node and its
sandbox pods, printed as YAML for `kubectl apply -f -` or a kustomize base."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(help="Kubernetes: a broker per node and its sandbox pods.", no_args_is_help=True)


@app.command("manifests")
def k8s_manifests(
    namespace: Annotated[str, typer.Option(help="the namespace of the broker and sandboxes")],
    image: Annotated[str, typer.Option(help="the broker's image (with `broker` on its PATH)")],
    sandbox_image: Annotated[str, typer.Option(help="the agent image")] = "broker-sandbox:py",
    root: Annotated[str, typer.Option(help="each node's sandbox root (hostPath)")] = (
        "/var/lib/sandbox-broker"
    ),
    ledger: Annotated[str, typer.Option(help="the fleet's PostgreSQL URL, no password")] = (
        "postgresql://broker@postgres:5432/broker"
    ),
    sandbox: Annotated[str, typer.Option(help="the sandbox pod template's id")] = "sb-example",
    node: Annotated[str, typer.Option(help="the node the sandbox pod runs on")] = "node-a",
) -> None:
    """Print the Namespace, broker ConfigMap and DaemonSet, NetworkPolicies, sandbox Pod."""
    from broker.cli.common import fail, out
    from broker.config import ledger_url
    from broker.errors import ConfigError
    from broker.hosting import kubernetes
    from broker.hosting.runtimes.spec import SANDBOX_ID

    if not SANDBOX_ID.match(sandbox):
        fail(f"--sandbox {sandbox!r} must match {SANDBOX_ID.pattern[:-2]}")
    try:
        ledger_url({"ledger": ledger})
    except ConfigError as exc:
        fail(f"--ledger: {exc}")
    m = kubernetes.Manifests(
        namespace=namespace,
        image=image,
        sandbox_image=sandbox_image,
        root=root.rstrip("/") or "/",
        ledger=ledger,
        sandbox_id=sandbox,
        node=node,
    )
    out.print(kubernetes.render(kubernetes.manifests(m), m), end="", markup=False)
