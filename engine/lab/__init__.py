"""The lab floor: what a teaching session drives over the serving stack and the what-if executor.
One facade (facade.py) over three labs: live/ (a fleet on this machine), simulated/ (the
same code on a virtual clock), remote/ (an existing vLLM or SGLang server); and what they
share: levers' limits, traffic, the proxy hop, the envelope and the recommended shape."""
