"""Generator replica: inference engines and the agent that serves them to the trainer."""
