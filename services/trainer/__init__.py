"""Trainer: rollout coordinator, RL learner and weight publisher."""
