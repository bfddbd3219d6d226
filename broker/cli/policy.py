"""`broker policy check | explain`: what a policy file says, and which rule decides."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from broker.cli.common import (
    ConfigOpt,
    JsonOpt,
    PolicyOpt,
    StateOpt,
    assemble,
    guarded,
    out,
    print_json,
)
from broker.config import Config
from broker.errors import BrokerError
from broker.models import Verdict
from broker.policy import Policy, load_policy
from broker.registry import Registry, default_registry
from broker.render import terminal

app = typer.Typer(help="Check and explain policy files.", no_args_is_help=True)


@app.command("check")
def check(file: Path, config: ConfigOpt = None, state: StateOpt = None) -> None:
    """Load a policy file and say whether it is valid."""
    registry = guarded(default_registry)
    pol = guarded(lambda: load_policy(file, registry.reversibility()))
    out.print(f"{terminal(str(file))}: ok, {len(pol.rules)} rule(s)")
    for rule in pol.rules:
        cond = f" when {dict(rule.when)}" if rule.when else ""
        extra = ""
        if rule.action == "approve":
            extra = (
                f" (approvals={rule.approvals}, timeout={rule.timeout_s:g}s, "
                f"on_timeout={rule.on_timeout})"
            )
        what = terminal(rule.effect + cond)
        out.print(f"  {rule.label}: {what} → {rule.action}{extra}: {terminal(rule.reason)}")


@app.command("explain")
def explain(
    request: Annotated[Path, typer.Argument(help="a request file (JSON)")],
    policy: PolicyOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Say which rule decides a request, and why the others do not."""
    cfg, registry, pol = assemble(config, state, policy)
    verdict, lines = guarded(lambda: _explain(request, cfg, registry, pol))
    if json_out:
        print_json({"verdict": verdict.to_json(), "trace": lines})
        return
    out.print(f"policy: {terminal(pol.source)}")
    for line in lines:
        out.print(f"  {terminal(line)}")
    out.print(f"→ [bold]{verdict.action}[/] by {verdict.rule}: {terminal(verdict.reason)}")


def _explain(
    request: Path, cfg: Config, registry: Registry, pol: Policy
) -> tuple[Verdict, list[str]]:
    """The verdict and trace for a request file; a file that is no request is an error."""
    from broker import intake

    data = Path(request).read_bytes()
    doc = intake.parse_json(data, cfg.limits.max_depth)  # Rejected is a BrokerError
    if not isinstance(doc, dict) or not isinstance(doc.get("effect"), str):
        raise BrokerError(f"{request}: not a request (no 'effect')")
    params: dict[str, Any] = doc["params"] if isinstance(doc.get("params"), dict) else {}
    effect = doc["effect"]
    if effect not in registry:
        raise BrokerError(
            f"no effect named {effect!r} is registered: the broker answers such a "
            "request `invalid` before any rule is consulted"
        )
    return pol.explain(effect, params, registry.get(effect).reversible)
