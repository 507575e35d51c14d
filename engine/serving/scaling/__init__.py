"""The fleet of replicas behind the router, how it grows and shrinks (provisioning) and who
decides (the autoscaler)."""
