"""What runs a step on a device: the Executor protocol the engine is handed, the live executor
(weights, tokenizer, KV cache) and its model runner, CUDA's memory sizing, graphs and staged inputs,
and the warm-up before a server says it is ready. The what-if simulator's executor stands beside it
(engine/sim/)."""
