"""One sandbox served for as long as it lives: by the broker that owns the state dir
when there is one (handed over through its control socket, broker.loop.ownership), else
by a broker this process runs. If the owner goes away meanwhile, this process takes
over: nothing the sandbox wrote waits for long, and nothing is served twice."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.clock import REAL
from broker.config import Config
from broker.errors import BrokerError, OwnerGone, StateBusy
from broker.loop import control_client, lockfile

if TYPE_CHECKING:  # the pipeline is imported when this process serves (on its own thread)
    from broker.approval.notify import Notifier
    from broker.loop.pipeline import Broker
    from broker.models import Record
    from broker.policy.ruleset import Policy
    from broker.registry import Registry

log = logging.getLogger("broker.run")
OnBroker = Callable[["Broker"], Callable[[], None] | None]
"""Called with a broker this process runs, before it serves; what it returns is called
after that broker stops (a surface's observers: broker.integrations.github_cards)."""
TAKEOVER_S = 30.0  # how long to try to become the owner when the owner went away
LOOK_EVERY_S = 0.005
LOOK_FOR_S = 2.0
"""A new sandbox's outbox is looked at every LOOK_EVERY_S for its first LOOK_FOR_S, then
watched with inotify. Why not watched from the start: closing an inotify instance that
watched anything waits for the kernel's mark reaper (an SRCU grace period), 5–17 ms
measured here, and a short run paid it in its exit, while its caller waited. A run that
lives past LOOK_FOR_S pays it once against seconds; a shorter one pays up to 400 looks,
≈ 55 µs of CPU each with its wake-up (≈ 21 ms over the 2 s). Its first request waits
LOOK_EVERY_S / 2 more on average, against the ~100 ms that building its broker takes."""


class Serving:
    """Serves `sandbox_id` from `start()` until `finish()`, owner or client."""

    def __init__(
        self,
        config: Config,
        checked: Callable[[], tuple[Registry, Policy]],
        sandbox_id: str,
        *,
        on_pending: Callable[[Record], None] | None = None,
        on_broker: OnBroker | None = None,
        notifier: Notifier | None = None,
        say: Callable[[str], None] = print,
    ) -> None:
        self.config = config
        self.checked = checked  # the registry and policy, checked when a broker is built
        self.sandbox_id = sandbox_id
        self.on_pending = on_pending
        self.on_broker = on_broker
        self.notifier = notifier
        self.say = say
        self.broker: Broker | None = None
        self._client: control_client.ControlClient | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._failure: list[BaseException] = []
        self._lock = threading.Lock()
        self._finishing = False
        self._detach: Callable[[], None] | None = None
        self._exited = threading.Event()
        self._nudge = threading.Event()  # the outbox changed, or the sandbox exited
        self.engaged = False  # whether anything (the owner, or this process) served it

    @property
    def owner(self) -> bool:
        return self.broker is not None

    def start(self, *, when_written: bool = False) -> None:
        """Hand the sandbox to the owner, or become the owner; raises what stops both.

        With `when_written` (a new sandbox: nothing of it waits in the ledger) and no
        owner serving, this process becomes the owner only once the sandbox writes into
        its outbox, or is found to have written when it exits (:meth:`exited`): a run
        whose agent asks for nothing builds no broker. Blocks until then."""
        owner = lockfile.served(self.config.state_dir)
        if when_written and not owner and not self._await_write():
            return
        with self._lock:
            self._attach(deadline=REAL.monotonic() + TAKEOVER_S)
            self.engaged = True

    def exited(self) -> None:
        """The sandbox's processes have exited (its container may still be being
        removed): what is in its outbox is all it will write."""
        self._exited.set()
        self._nudge.set()

    def finish(self) -> None:
        """The sandbox exited: see what it left processed, then let go."""
        with self._lock:
            self._finishing = True
            client = self._client
        if client is not None:
            try:
                client.release()
                client.close()
                return
            except OwnerGone:
                client.close()
                with self._lock:
                    self._client = None
                    self._attach(REAL.monotonic() + TAKEOVER_S, client_ok=False)
        self._stop_own()

    # -- how ------------------------------------------------------------------------------

    def _await_write(self) -> bool:
        """Until the outbox holds anything (True) or the sandbox exited without (False)."""
        outbox = self.config.sandboxes_dir / self.sandbox_id / "outbox"
        end = REAL.monotonic() + LOOK_FOR_S
        while REAL.monotonic() < end:
            if _holds_any(outbox):
                return True
            if self._exited.is_set():  # a write may have come just before its exit
                return _holds_any(outbox)
            self._nudge.wait(LOOK_EVERY_S)
            self._nudge.clear()
        from broker.intake.inotify import Inotify

        try:
            watch = Inotify(lambda folder, name, mask: self._nudge.set())
        except OSError:
            return True  # no inotify here: serve it from the start
        try:
            watch.add(outbox)  # in place before the next look: no write is missed
            while not _holds_any(outbox):
                if self._exited.is_set():
                    return _holds_any(outbox)  # a write may have come just before its exit
                self._nudge.wait()
                self._nudge.clear()
            return True
        finally:
            watch.close()

    def _attach(self, deadline: float, client_ok: bool = True) -> None:
        """Serve through the owner if one answers, else as the owner (lock held)."""
        while True:
            if client_ok and lockfile.served(self.config.state_dir):
                client = control_client.connect(
                    self.config.state_dir, self._pending_id, on_gone=self._owner_gone
                )
                if client is not None:
                    try:
                        client.serve(self.sandbox_id)
                    except OwnerGone:
                        client.close()
                    else:
                        self._client = client
                        owner = lockfile.read_owner(self.config.state_dir)
                        self.say(f"broker: handed sandbox {self.sandbox_id} to {owner}")
                        return
            try:
                self._run_own()
                return
            except StateBusy:
                if REAL.monotonic() >= deadline:
                    raise
                REAL.sleep(0.05)  # the owner is starting or stopping: ask again

    def _run_own(self) -> None:
        from broker.intake.outbox import from_layout
        from broker.loop.pipeline import Broker

        broker = Broker(self.config, *self.checked())
        broker.command = "broker run"
        broker.lock.acquire(broker.command)  # StateBusy: someone else owns it
        try:
            broker.add(from_layout(self.config.sandboxes_dir, self.sandbox_id))
            if self.on_broker is not None:  # what a surface attaches (GitHub's threads)
                self._detach = self.on_broker(broker)
        except BaseException:
            broker.lock.release()
            broker.ledger.close()
            raise
        if self.notifier is not None:
            broker.notify_with(self.notifier)
        if self.on_pending is not None:
            tell = self.on_pending
            broker.on_change.append(
                lambda r: tell(r) if r.state == "pending" and r.sandbox == self.sandbox_id else None
            )
        ready = threading.Event()

        def serve() -> None:
            try:
                broker.serve(self._stop, ready=ready.set, drain=True)
            except BaseException as exc:
                self._failure.append(exc)
                ready.set()

        self._thread = threading.Thread(target=serve, name="broker-serve", daemon=True)
        self._thread.start()
        ready.wait(60)
        if self._failure:
            raise self._failure[0]
        self.broker = broker

    def _stop_own(self) -> None:
        if self._thread is None or self.broker is None:
            return
        self._stop.set()
        self.broker.wake()
        self._thread.join(120)
        if self._detach is not None:  # after the broker: its last observers have run
            self._detach()
            self._detach = None
        if self._failure:
            raise self._failure[0]

    def _pending_id(self, request_id: str) -> None:
        if self.on_pending is None:
            return
        from broker.fleet import qualify
        from broker.store.factory import open_store

        ledger = open_store(self.config)
        try:
            record = ledger.get(qualify(ledger.host, self.sandbox_id), request_id)
        finally:
            ledger.close()
        if record is not None:
            self.on_pending(record)

    def _owner_gone(self) -> None:
        """The owner closed our connection: take its place (or find the next owner)."""
        with self._lock:
            if self._finishing or self._client is None:
                return
            self._client.close()
            self._client = None
            self.say(f"broker: the serving broker went away; serving {self.sandbox_id} here")
            try:
                self._attach(REAL.monotonic() + TAKEOVER_S)
            except BrokerError as exc:
                log.error("sandbox %s: cannot go on serving it: %s", self.sandbox_id, exc)


def _holds_any(outbox: os.PathLike[str]) -> bool:
    """Whether the sandbox has written anything into its outbox (a temp file counts)."""
    with os.scandir(outbox) as entries:
        return any(True for _ in entries)
