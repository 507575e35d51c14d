"""One replica across processes: the rank group, tensor-parallel collectives, pipeline stages'
point-to-point programme, the ranks after rank 0, and the timings and timeouts they report."""
