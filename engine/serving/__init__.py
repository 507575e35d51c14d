"""The serving stack above one engine: replica processes (and, as they arrive, the router,
central queue, autoscaler and metrics bus). Nothing here imports Flask."""
