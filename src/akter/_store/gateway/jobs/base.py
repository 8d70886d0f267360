"""What the job gateway's parts share: the store, the framework clock and the local clock."""

from __future__ import annotations

from typing import TYPE_CHECKING

from akter._local_clock import LocalClock

if TYPE_CHECKING:
    from akter._store.pool import Clock, Store


class GatewayBase:
    """The store and clocks of a job gateway part, on the framework clock's offset."""

    def __init__(self, store: Store, clock: Clock, local: LocalClock | None = None) -> None:
        self._store = store
        self._clock = clock
        self._local = local or LocalClock()

    @property
    def _off(self) -> int:
        return self._clock.offset_ms
