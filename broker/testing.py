"""Test helpers shipped for plugin authors: a real Context for handler tests, a fake
handler, a clock the test moves, and a broker in a thread.

    from broker.testing import BrokerHarness, FakeHandler, make_context
    from effects.files import FilesWrite

    ctx = make_context({"root": str(tmp_path)}, integration="files")
    preview = FilesWrite().preview({"path": "a.txt", "content": "hello"}, ctx)
    assert preview.body == "hello"  # a new file: the content it gets, literally

    with BrokerHarness(tmp_path, handlers=[FakeHandler("demo.ping")]) as h:
        result = h.submit(h.request("demo.ping"))  # a whole envelope: version, id, effect
        assert result["status"] == "applied"

`BrokerHarness(..., staged=True)` (or `staged=["demo.*"]`) runs it in staged mode: the
result is `staged`, its output the verdict and the preview, and nothing is applied.

`BrokerHarness(..., clock=FakeClock())` runs the broker on time the test moves: a
deadline, an expiry (`on_timeout`), a rate window or a retry comes due when the test
says `clock.advance(seconds)`, never by waiting for it:

clock = FakeClock()
with BrokerHarness(tmp_path, handlers=[...], policy=POLICY, clock=clock) as h:
    h.write("r.json", request)              # its rule says timeout = "1h"
    h.wait("r", terminal=False)             # pending
    clock.advance(3600)
    assert h.wait("r")["status"] == "expired"
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from broker.clock import REAL, Clock, FakeClock
from broker.config import Config, Limits
from broker.context import Memo, context_for
from broker.errors import EffectFailed
from broker.intake.outbox import attach
from broker.loop.pipeline import Broker
from broker.models import TERMINAL, Preview, Record, canonical_json, sha256_hex
from broker.policy.ruleset import Policy, parse_policy
from broker.registry import Registry
from broker.staged import Staged
from broker.typing import JSON, Params
from effects.base import Context

__all__ = ["BrokerHarness", "FakeClock", "FakeHandler", "make_context"]


@functools.cache
def _scratch() -> Path:
    """This process's parent of make_context's own state dirs, removed at exit (every
    test that made a context without a state dir had left one in the temp dir)."""
    root = Path(tempfile.mkdtemp(prefix="broker-ctx-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def make_context(
    settings: Mapping[str, Any] | None = None,
    *,
    integration: str = "test",
    sandbox: str = "sandbox-1",
    request_id: str = "req-1",
    request_sha256: str | None = None,
    params: Mapping[str, Any] | None = None,
    state_dir: Path | None = None,
    config_dir: Path | None = None,
    attachments: Mapping[str, Path] | None = None,
    secrets: Mapping[str, str] | None = None,
    memo: Memo | None = None,
    credentials: Mapping[str, Mapping[str, Any]] | None = None,
) -> Context:
    """A real Context, built the way the broker builds one for a recorded request.

    `settings` is `[integrations.<integration>]`; `state_dir` defaults to a new
    directory, removed when the process exits. Its secret references (`*_env`,
    `*_file`, files relative to `config_dir`) resolve as they do on the host, unless
    `secrets` gives the values by key. `request_sha256` defaults to the sha256 of the
    request the context describes. Pass the same `memo` to the preview's and the
    apply's contexts to carry what the preview remembered (`ctx.remember`) to apply,
    as the broker does between them. `credentials` is `[credentials.*]`: a provider
    the settings name (`credential = "NAME"`) mints through `ctx.credential`; close
    `ctx.grants` after the call to revoke what it minted, as the broker does.
    """
    state = state_dir or Path(tempfile.mkdtemp(dir=_scratch()))
    config = Config(
        state_dir=state,
        integrations={integration: dict(settings or {})},
        credentials={k: dict(v) for k, v in (credentials or {}).items()},
        source=(config_dir / "broker.toml") if config_dir else None,
    )
    ctx = context_for(config, _applying(sandbox, request_id, integration, params), memo)
    changes: dict[str, Any] = {}
    if request_sha256 is not None:
        changes["request_sha256"] = request_sha256
    if secrets is not None:
        known = dict(secrets)
        changes["secret"] = known.get
    if attachments is not None:
        given = dict(attachments)

        def attachment(name: str) -> Path:
            if name not in given:
                raise EffectFailed(f"failed: no attachment named {name!r} came with the request")
            return given[name]

        changes["attachment"] = attachment
    return dataclasses.replace(ctx, **changes) if changes else ctx


def _applying(
    sandbox: str, request_id: str, integration: str, params: Mapping[str, Any] | None
) -> Record:
    """The ledger row of a request being applied, as a handler's context describes it."""
    effect = f"{integration}.test"
    envelope = {"version": 1, "id": request_id, "effect": effect, "params": dict(params or {})}
    payload = canonical_json(envelope)
    return Record(
        sandbox=sandbox,
        id=request_id,
        name=request_id,
        state="applying",
        received_at="1970-01-01T00:00:00.000Z",
        effect=effect,
        payload=payload.decode("utf-8"),
        sha256=sha256_hex(payload),
    )


FAKE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "value": {"type": ["string", "integer"]},
        "fail": {"type": "string"},
        "sleep": {"type": "number", "minimum": 0, "maximum": 30},
    },
    "additionalProperties": False,
}


class FakeHandler:
    """An effect that records each apply in memory; `fail` in params makes it fail."""

    undo: str = "nothing to undo: the fake handler only records calls"
    assess_inline: bool = True  # its reversible_for reads a flag

    def __init__(
        self,
        name: str = "test.record",
        *,
        reversible: bool = True,
        idempotent: bool = True,
        schema: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.reversible = reversible
        self.idempotent = idempotent
        self.schema: Mapping[str, Any] = schema or FAKE_SCHEMA
        self.applied: list[dict[str, Any]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def check_config(self, settings: Mapping[str, Any]) -> None:
        return None

    def check(self, params: Params, ctx: Context) -> None:
        return None

    def reversible_for(self, params: Params, ctx: Context) -> bool:
        return self.reversible

    def preview(self, params: Params, ctx: Context) -> Preview:
        return Preview(
            title=f"record {params.get('value')!r}",
            target=f"test: {self.name}",
            body=json.dumps(dict(params), indent=2, ensure_ascii=False),
            body_kind="json",
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        self.started.set()
        self.release.wait(30)
        if "sleep" in params:
            REAL.sleep(float(params["sleep"]))
        if "fail" in params:
            raise EffectFailed(f"failed: {params['fail']}")
        self.applied.append(dict(params))
        return {"recorded": len(self.applied), "value": params.get("value")}


class BrokerHarness:
    """A real Broker serving one attach-mode outbox in a thread, in a temp dir."""

    def __init__(
        self,
        base: Path,
        *,
        handlers: Iterable[Any] = (),
        policy: str | Mapping[str, Any] | Policy | None = None,
        integrations: Mapping[str, Mapping[str, Any]] | None = None,
        credentials: Mapping[str, Mapping[str, Any]] | None = None,
        limits: Limits | None = None,
        sandbox: str = "default",
        builtins: bool = True,
        prepare: Callable[[Broker], None] | None = None,
        staged: Staged | bool = False,
        clock: Clock = REAL,
        rescan_interval_s: float = 2.0,
    ) -> None:
        self.base = Path(base)
        self.clock = clock  # the broker's: a FakeClock makes time the test's to move
        self.outbox = self.base / "outbox"
        self.results = self.base / "results"
        self.state = self.base / "state"
        for d in (self.outbox, self.results, self.state):
            d.mkdir(parents=True, exist_ok=True)
        self.registry = Registry()
        if builtins:
            self.registry.load_entry_points()
        for handler in handlers:
            self.registry.register(handler, "tests")
        self.config = Config(
            state_dir=self.state,
            limits=limits or Limits(),
            integrations=dict(integrations or {}),
            credentials={k: dict(v) for k, v in (credentials or {}).items()},
            rescan_interval_s=rescan_interval_s,
            staged=staged if isinstance(staged, Staged) else Staged.parse(staged),
        )
        self.registry.check_config(self.config.integrations)
        self.policy = _policy(policy, self.registry)
        self.sandbox = sandbox
        self.prepare = prepare  # called with each new Broker before it serves (observers)
        self.broker: Broker | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> BrokerHarness:
        self._stop.clear()
        self.broker = Broker(self.config, self.registry, self.policy, clock=self.clock)
        self.broker.add(attach(self.sandbox, self.outbox, self.results, self.state))
        if self.prepare is not None:
            self.prepare(self.broker)
        ready = threading.Event()

        def run() -> None:
            assert self.broker is not None
            try:
                self.broker.serve(self._stop, ready=ready.set)
            except BaseException as exc:  # surfaced by stop()
                self.error = exc
                ready.set()

        self._thread = threading.Thread(target=run, name="broker-harness", daemon=True)
        self._thread.start()
        ready.wait(30)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self.broker is not None:
            self.broker.wake()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        if self.error is not None:
            raise self.error

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> BrokerHarness:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write(self, name: str, data: bytes | str | Mapping[str, Any]) -> None:
        """Write a file into the outbox atomically, as the protocol asks of agents."""
        if isinstance(data, Mapping):
            data = json.dumps(data)
        if isinstance(data, str):
            data = data.encode("utf-8")
        tmp = self.outbox / f".{name}.{uuid.uuid4().hex}.tmp"
        tmp.write_bytes(data)
        os.rename(tmp, self.outbox / name)

    def request(
        self, effect: str, params: Mapping[str, Any] | None = None, **fields: Any
    ) -> dict[str, Any]:
        """A request envelope with a fresh id."""
        doc: dict[str, Any] = {
            "version": 1,
            "id": uuid.uuid4().hex,
            "effect": effect,
            "params": dict(params or {}),
        }
        doc.update(fields)
        return doc

    def submit(
        self,
        doc: Mapping[str, Any],
        *,
        name: str | None = None,
        timeout: float = 10.0,
        terminal: bool = True,
    ) -> dict[str, Any]:
        """Write `doc` and wait for its result (terminal unless told otherwise)."""
        rid = str(doc.get("id") or name)
        self.write(f"{name or rid}.json", doc)
        return self.wait(rid, timeout=timeout, terminal=terminal)

    def wait(
        self, request_id: str, *, timeout: float = 10.0, terminal: bool = True
    ) -> dict[str, Any]:
        path = self.results / f"{request_id}.json"
        end = REAL.monotonic() + timeout
        while REAL.monotonic() < end:
            try:
                result: dict[str, Any] = json.loads(path.read_bytes())
            except (FileNotFoundError, ValueError):
                result = {}
            if result and (not terminal or result.get("status") in TERMINAL):
                return result
            REAL.sleep(0.005)
        raise TimeoutError(
            f"no {'terminal ' if terminal else ''}result for {request_id} within {timeout}s"
        )


def _policy(policy: str | Mapping[str, Any] | Policy | None, registry: Registry) -> Policy:
    """The harness's policy: given whole, as TOML text or as its parsed table."""
    if isinstance(policy, Policy):
        return policy
    if policy is None:
        return Policy()
    if isinstance(policy, str):
        import tomllib

        policy = tomllib.loads(policy)
    return parse_policy(policy, registry.reversibility(), "test", registry.schemas())
