"""The live lab: a real fleet on this machine, its HTTP clients and the failure switches."""
