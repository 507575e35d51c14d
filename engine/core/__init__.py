"""One replica's step loop and its state: the engine (add, step, abort, stats), the scheduler and its
policies, the block manager and KV plan, sequences and what a step records. Imports nothing heavy
here: the web floor reads `engine.core.sequence`'s contracts without torch."""
