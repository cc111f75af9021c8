"""Deployed Cellpilot services: one sub-package per service, each a thin async shell."""
