"""From logits to tokens: the batched sampler, the logits processors (penalties, bias), log
probabilities, and speculative decoding's n-gram guesses and their check."""
