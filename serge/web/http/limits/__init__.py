"""Budgets on requests: quotas reserved before a model runs and usage counted after, and the per-app flood guard."""
