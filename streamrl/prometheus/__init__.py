"""Prometheus integration: the rules file every deployment loads, and its HTTP API's client
(`streamrl run --prometheus`'s local server is streamrl/local/prometheus.py)."""

from pathlib import Path

RULES_FILE = Path(__file__).with_name("rules.yaml")
"""Recording rules and alerts (docs/observability.md defines them)."""
