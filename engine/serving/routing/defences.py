"""The serving layer's defences: each a guard the guide names, on by default; off reproduces the
production failure it prevents (DESIGN.md "Defence levers", the /failures gallery).

One object, held by the Fleet (`fleet.defences`); the router, the API's streams, the fleet and
the autoscaler read it at the moment they decide, so a lever change takes effect in place and
the setting lives here only. The engine's own defences (chunked_prefill, aging,
collective_timeout, batch_invariant) are EngineConfig fields: they travel to the replica
processes with the rest of its config. `stream_flush` and the client levers belong to the lab's
clients and the proxy in front of the server (the lab's levers)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass
class Defences:
    heartbeat: bool = True  # `: ping` on a waiting stream, so an idle-timeout proxy keeps it open
    cancel_on_disconnect: bool = True  # a client that hangs up aborts its request
    queue_bound: bool = True  # queue_cap refuses past the cap; off, the queue grows without limit
    deadline_recheck: bool = True  # an expired request is dropped before its prefill is spent
    retry_jitter: bool = True  # Retry-After carries jitter, so refused clients do not return in step
    central_queue: bool = True  # one queue, dispatched to the least loaded; off, per-replica inboxes
    prefix_aware_routing: bool = True  # a prompt goes where its prefix is cached
    drain_on_scale_in: bool = True  # scale-in finishes residents; off, it kills the replica
    asymmetric_windows: bool = True  # short window to scale up, long one to scale down
    count_pending: bool = True  # replicas still starting count as capacity on the way

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_levers(cls, levers: dict[str, Any]) -> Defences:
        """The defences these lever values set (only its own keys are read)."""
        return cls(**{key: levers[key] for key in cls.names() if key in levers})

    def update(self, **changes: bool) -> None:
        """In place: everything holding this object sees the change at its next decision."""
        for key, value in changes.items():
            if key not in self.names():
                raise KeyError(key)
            setattr(self, key, bool(value))
