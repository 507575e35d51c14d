"""Composition roots: `python -m engine serve` (api_server) and app.py's remote mode
(remote_server) join the floors here and nowhere else below app.py."""
