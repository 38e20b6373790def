"""Output-length ranker: predicts which prompts will produce long outputs, learning online."""
