"""The simulated lab: the serving stack on the what-if executor's clock, at speed, and the
predict-then-run check against the live engine."""
