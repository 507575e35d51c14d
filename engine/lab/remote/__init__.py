"""The remote lab: the same pages over an existing OpenAI-compatible server (vLLM, SGLang)."""
