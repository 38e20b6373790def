"""Prometheus integration: the rules file every deployment loads, and a local server for
`streamrl run --prometheus`."""

from pathlib import Path

RULES_FILE = Path(__file__).with_name("rules.yaml")
"""Recording rules and alerts (docs/observability.md defines them)."""
