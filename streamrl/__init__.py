"""StreamRL: disaggregated RL post-training of LLMs with stream generation (the shared core)."""

__version__ = "0.1.0"
