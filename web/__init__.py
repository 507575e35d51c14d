"""The web layer (Flask). create_api_app serves the OpenAI-compatible API over a Fleet; the
teaching app (app.py) adds pages and sockets to the same blueprints."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from flask import Flask

from web.openai_api import DEFAULT_PING_S, MAX_BODY_BYTES, api

if TYPE_CHECKING:  # the fleet (and torch, in its replicas) is the composition root's to import
    from engine.serving.scaling.fleet import Fleet


def create_api_app(fleet: Fleet, sse_ping_s: float = DEFAULT_PING_S, stream_flush: bool = True) -> Flask:
    """stream_flush False: each SSE stream is held and sent whole when it ends (`serve
    --stream-flush false`)."""
    root = Path(__file__).resolve().parent.parent  # templates/ and static/ live at the top level
    app = Flask(__name__, static_folder=str(root / "static"), template_folder=str(root / "templates"))
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.config["SSE_PING_S"] = sse_ping_s
    app.config["SSE_FLUSH"] = stream_flush
    app.extensions["servelab_fleet"] = fleet
    app.register_blueprint(api)
    return app
