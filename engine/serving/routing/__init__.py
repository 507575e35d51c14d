"""Admission and dispatch: the router, the one central request queue, rate limits and the
defences the guide names."""
