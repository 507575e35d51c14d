"""The architecture diagram: the pieces of the serving system, each tagged with the step that
introduces it. A page draws the pieces introduced so far, highlights the new one, and shows
the ones still to come as outlines, so the picture grows as the learner walks the steps."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Box:
    key: str
    label: str
    sub: str
    step: int
    x: int
    y: int
    w: int = 120
    h: int = 54

    @property
    def cx(self) -> int:
        return self.x + self.w // 2

    @property
    def cy(self) -> int:
        return self.y + self.h // 2


BOXES = (
    Box("client", "Clients", "prompts in, tokens out", 0, 10, 100, 100),
    Box("flood", "Load generator", "the flood", 8, 10, 14, 100),
    Box("router", "Router", "auth, limits, SSE", 1, 140, 100),
    Box("queue", "Request queue", "cap, deadline, 429", 2, 290, 100),
    Box("scheduler", "Scheduler", "continuous batching", 4, 440, 100),
    Box("worker", "Replica", "prefill + decode", 3, 600, 100, 140),
    Box("kv", "Paged KV cache", "blocks, prefix hits", 5, 600, 186, 140),
    Box("shards", "Model shards", "tensor parallel", 6, 600, 14, 140),
    Box("stages", "Pipeline stages", "layers in turn, a batch each", 6, 440, 14, 140),
    Box("autoscaler", "Autoscaler", "warm pool, drain", 7, 290, 186, 270),
)
EDGES = (
    ("client", "router"),
    ("router", "queue"),
    ("queue", "scheduler"),
    ("scheduler", "worker"),
    ("worker", "kv"),
    ("worker", "shards"),
    ("stages", "shards"),
    ("flood", "router"),
    ("autoscaler", "worker"),
)


def diagram(step: int | None) -> dict:
    """Boxes with their state for a page: 'new' (this step's), 'known', or 'ghost' (later).
    step None (the lab) shows everything as known."""
    boxes = {b.key: b for b in BOXES}
    states = {}
    for box in BOXES:
        if step is None or box.step < step:
            states[box.key] = "known"
        elif box.step == step:
            states[box.key] = "new"
        else:
            states[box.key] = "ghost"
    edges = []
    for a, b in EDGES:
        src, dst = boxes[a], boxes[b]
        ghost = "ghost" in (states[a], states[b])
        if src.y == dst.y:  # same row: right edge to left edge
            points = (src.x + src.w, src.cy, dst.x, dst.cy)
        elif src.x == dst.x or abs(src.cx - dst.cx) < 40:  # stacked: bottom/top edges
            down = dst.y > src.y
            points = (src.cx, src.y + src.h if down else src.y, dst.cx, dst.y if down else dst.y + dst.h)
        else:  # diagonal: side to the nearest side
            right = dst.x > src.x
            points = (src.x + src.w if right else src.x, src.cy, dst.x if right else dst.x + dst.w, dst.cy)
        edges.append({"points": points, "ghost": ghost})
    return {"boxes": [(box, states[box.key]) for box in BOXES], "edges": edges, "width": 760, "height": 250}
