"""The fleet's own settings (engine/serving/scaling/fleet.py's Fleet, and provisioning.py's side of it)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.levers import LEVERS


@dataclass
class FleetConfig:
    """The fleet's own settings. warm_pool and provision_delay_s live here and only here (the
    fleet is what provisions): the autoscaler and the lab set them through the fleet."""

    replicas: int = 1
    drain_timeout_s: float = 30.0
    warm_pool: int = LEVERS["warm_pool"].default  # loaded, idle, not routed to: promoted in under a second
    provision_delay_s: float = LEVERS["provision_delay_s"].default  # a cold start waits this, then loads
    # A prefill/decode split (engine/serving/disagg/): this many decode replicas behind the serving
    # ones, which then prefill only; 0: colocated, every replica does both.
    decode_replicas: int = 0
