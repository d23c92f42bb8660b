"""Placeholder demo: replaced below."""
