"""What the serving stack measures and says: the metrics bus and its snapshot, Prometheus text,
request traces and the event log."""
