"""Integrations with training frameworks (optional extras: `pip install ringps[lightning]`)."""
