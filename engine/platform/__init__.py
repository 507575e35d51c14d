"""The machine under the engine: CPU features and the ISA override, CUDA devices, threads fitted to
the cores, huge pages, dtype names, and what else the host did while a measurement ran. The bottom
of the engine floor: it imports no other room."""
