"""Which of this process's cores a live replica runs on (a simulated one ignores them)."""

from __future__ import annotations

from collections.abc import Iterable

from engine.platform.machine import affinity


def split_cores(num_replicas: int) -> list[list[int]]:
    """Each replica gets its share of this process's cores (they share when there are fewer)."""
    cores = affinity()
    if num_replicas >= len(cores):
        return [[cores[i % len(cores)]] for i in range(num_replicas)]
    per = len(cores) // num_replicas
    return [cores[i * per : (i + 1) * per] for i in range(num_replicas)]


def spare_cores(held: Iterable[list[int]]) -> list[int]:
    """The least-used core, for a replica started beside the others (they share when few)."""
    use = dict.fromkeys(affinity(), 0)
    for cores in held:
        for core in cores:
            use[core] = use.get(core, 0) + 1
    return [min(use, key=use.__getitem__)]
