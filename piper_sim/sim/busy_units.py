"""Compute beside communication kernels: an issued collective holds a share of its rank's compute units.

A communication library's kernels run on streaming multiprocessors (AMD: compute units) of their own while they
run: NCCL's CTAs do not share an SM with compute kernels (NVIDIA/nccl issue 689), and DeepEP runs on the SMs it is
given. So a compute task that runs beside an issued collective (an overlapped all-to-all, ZeRO-3's prefetched
gathers) runs on the units the collective leaves, at (1 - share) of its rate, share being the library's
`compute_units` on the machine (topology collectives.<library>) over the device's (profile `compute_units`). A
blocking collective holds the program counter, so no compute of its rank runs beside it.

Owns BusyUnits: per lane, the issued collectives in flight that hold units, and the timing of a compute task
that starts while one is: it progresses at the reduced rate until the collectives end (or it is done), then at the
full rate, in simulated time (the lane's process waits on the collectives' ends). Where nothing is held the
engine times compute as the host model does (no event). Must not import torch.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import simpy

MAX_SHARE = 0.95  # collectives beside compute never hold all of a device's units between them


class BusyUnits:
    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self._held: dict[int, list[tuple[simpy.Event, float]]] = {}

    def hold(self, lane_id: int, done: simpy.Event, share: float) -> None:
        """An issued collective of the lane holds `share` of each member's units until `done`."""
        if share > 0:
            self._held.setdefault(lane_id, []).append((done, share))

    def holding(self, lane_id: int) -> bool:
        """Whether a collective of the lane may still hold units (one whose end has not come yet)."""
        return bool(self._live(lane_id))

    def _live(self, lane_id: int) -> list[tuple[simpy.Event, float]]:
        """The lane's collectives that still hold units (those that ended let go)."""
        held = self._held.get(lane_id)
        if held:
            held[:] = [(ev, share) for ev, share in held if not ev.triggered]
        return held or []

    def compute(self, lane_id: int, clock: np.ndarray, seconds: float | np.ndarray) -> Iterator[simpy.Event]:
        """Each member's compute of `seconds` from its clock, beside the lane's collectives in flight: clock moved to
        each member's end."""
        left = np.array(np.broadcast_to(seconds, clock.shape), dtype=float)
        at = clock.copy()
        done = np.full(clock.shape, np.nan)  # each member's end, once its compute has ended
        while True:
            held = self._live(lane_id)
            running = np.isnan(done)
            if not held:
                clock[:] = np.where(running, at + left, done)
                return
            rate = 1.0 - min(sum(share for _, share in held), MAX_SHARE)
            ends = at + left / rate
            last = float(ends[running].max())
            yield self.env.any_of([self.env.timeout(max(last - self.env.now, 0.0)), *(ev for ev, _ in held)])
            now = self.env.now
            ended = running & (ends <= now)
            done[ended] = ends[ended]
            if not np.isnan(done).any():
                clock[:] = done
                return
            left = np.where(np.isnan(done), np.maximum(left - np.clip(now - at, 0.0, None) * rate, 0.0), 0.0)
            at = np.maximum(at, now)
