"""Replica processes and the contract every replica keeps (live or simulated): the messages
on the pipe, the cores a replica owns."""
