"""Proof that a created container is the sandbox its spec asked for, before it starts.

A runtime reads its own inspect output into :class:`Observed` (None: the runtime's
inspect does not say). :func:`prove` compares it with the :class:`SandboxSpec`
property by property; a property contradicted, or one the runtime cannot show, is a
:class:`SandboxError` and the sandbox does not start. Options can be dropped or
renamed silently between engine versions (an unknown option ignored, a rootless mode
that skips limits): only what the engine reports afterwards counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from broker.errors import SandboxError
from broker.hosting.runtimes.spec import SandboxSpec

__all__ = ["PROPERTIES", "Observed", "prove"]


class Observed(NamedTuple):
    """What a runtime reports of a created container; None where it cannot tell."""

    network: str | None = None
    read_only_root: bool | None = None
    capabilities: frozenset[str] | None = None  # what the process may still hold
    no_new_privileges: bool | None = None
    privileged: bool | None = None
    user: str | None = None
    pids: int | None = None
    memory: int | None = None
    nano_cpus: int | None = None
    binds: Mapping[str, tuple[str, bool]] | None = None  # inside -> (host, writable)


Check = Callable[[SandboxSpec, Observed], "str | None"]


def bind_mounts(attrs: Mapping[str, Any]) -> dict[str, tuple[str, bool]] | None:
    """Destination → (source, writable) of an inspect's bind mounts, in the shape Docker
    and Podman share; None when the inspect does not report mounts at all."""
    if "Mounts" not in attrs:
        return None
    mounts = attrs["Mounts"] or ()
    return {
        m["Destination"]: (m["Source"], bool(m["RW"])) for m in mounts if m.get("Type") == "bind"
    }


def _network(spec: SandboxSpec, seen: Observed) -> str | None:
    return None if seen.network == "none" else f"network is {seen.network!r}, not 'none'"


def _root(spec: SandboxSpec, seen: Observed) -> str | None:
    return None if seen.read_only_root else "the root file system is writable"


def _caps(spec: SandboxSpec, seen: Observed) -> str | None:
    held = sorted(seen.capabilities or ())
    return None if not held else f"capabilities kept: {', '.join(held)}"


def _nnp(spec: SandboxSpec, seen: Observed) -> str | None:
    return None if seen.no_new_privileges else "no-new-privileges is not set"


def _privileged(spec: SandboxSpec, seen: Observed) -> str | None:
    return "the container is privileged" if seen.privileged else None


def _user(spec: SandboxSpec, seen: Observed) -> str | None:
    return None if seen.user == spec.user else f"user is {seen.user!r}, not {spec.user!r}"


def _pids(spec: SandboxSpec, seen: Observed) -> str | None:
    want = spec.limits.pids
    return None if seen.pids == want else f"pids limit is {seen.pids}, not {want}"


def _memory(spec: SandboxSpec, seen: Observed) -> str | None:
    return None if seen.memory == spec.memory else f"memory is {seen.memory}, not {spec.memory}"


def _cpus(spec: SandboxSpec, seen: Observed) -> str | None:
    want = spec.limits.nano_cpus
    return None if seen.nano_cpus == want else f"cpus are {seen.nano_cpus} nano, not {want}"


def _binds(spec: SandboxSpec, seen: Observed) -> str | None:
    want = {b.inside: (b.host, b.writable) for b in spec.binds}
    got = dict(seen.binds or {})
    if got == want:
        return None
    wrong = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    return "mounts differ at " + ", ".join(f"{k} ({got.get(k)} != {want.get(k)})" for k in wrong)


PROPERTIES: dict[str, tuple[str, Check]] = {
    "network": ("network", _network),
    "read_only_root": ("read-only root", _root),
    "capabilities": ("no capabilities", _caps),
    "no_new_privileges": ("no-new-privileges", _nnp),
    "privileged": ("not privileged", _privileged),
    "user": ("non-root user", _user),
    "pids": ("pids limit", _pids),
    "memory": ("memory limit", _memory),
    "nano_cpus": ("cpu limit", _cpus),
    "binds": ("outbox rw, results ro, nothing else", _binds),
}
"""Observed field -> (what it means, its check); every one must hold."""


def prove(spec: SandboxSpec, seen: Observed, runtime: str) -> None:
    """Raise SandboxError unless ``seen`` shows every property ``spec`` asks for."""
    problems: list[str] = []
    for attr, (meaning, check) in PROPERTIES.items():
        if getattr(seen, attr) is None:
            problems.append(f"{meaning}: {runtime} cannot prove it (its inspect does not say)")
            continue
        wrong = check(spec, seen)
        if wrong is not None:
            problems.append(f"{meaning}: {wrong}")
    if problems:
        raise SandboxError(
            f"sandbox {spec.sandbox_id} not started: {runtime} did not prove its hardening: "
            + "; ".join(problems)
        )
