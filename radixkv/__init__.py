"""radixkv: a radix-tree prefix cache for LLM KV blocks."""
