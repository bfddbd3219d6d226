"""Files waiting to be read, taken round-robin across outboxes: a flooding sandbox
makes a neighbour wait for one batch at most."""

from __future__ import annotations

import queue
from collections import deque

from broker.events import Event, FileSeen

MAX_BATCH = 64  # files taken per wake-up


class Backlog:
    """Names seen in each outbox, each once, in the order they were seen."""

    def __init__(self, max_batch: int = MAX_BATCH) -> None:
        self.max_batch = max_batch
        self._by_folder: dict[str, deque[str]] = {}
        self._queued: set[tuple[str, str]] = set()

    def __bool__(self) -> bool:
        return bool(self._by_folder)

    def holds(self, folder: str) -> bool:
        return folder in self._by_folder

    def add(self, seen: FileSeen) -> None:
        key = (seen.folder, seen.name)
        if key not in self._queued:
            self._queued.add(key)
            self._by_folder.setdefault(seen.folder, deque()).append(seen.name)

    def take(self) -> list[FileSeen]:
        """Up to `max_batch` names, one from each outbox in turn."""
        taken: list[FileSeen] = []
        while self._by_folder and len(taken) < self.max_batch:
            for folder in list(self._by_folder):
                names = self._by_folder[folder]
                name = names.popleft()
                self._queued.discard((folder, name))
                taken.append(FileSeen(folder, name))
                if not names:
                    del self._by_folder[folder]
                if len(taken) >= self.max_batch:
                    break
        return taken

    def wake_up(self, events: queue.Queue[Event], timeout: float) -> list[Event]:
        """What one wake-up handles: every other event that came, and a fair share of
        the files seen (waiting up to `timeout` for something, unless files wait)."""
        items: list[Event] = []
        if self:
            timeout = 0  # files wait: take what came, do not sleep
        try:
            first: Event | None = (
                events.get(timeout=timeout) if timeout > 0 else events.get_nowait()
            )
        except queue.Empty:
            first = None
        while first is not None:
            if isinstance(first, FileSeen):
                self.add(first)
            else:
                items.append(first)
            try:
                first = events.get_nowait()
            except queue.Empty:
                first = None
        items.extend(self.take())
        return items
