"""The load generator (`vllm bench serve`'s traffic and metrics) that benchmarks and the lab's
clients drive the stack with."""
