"""Gardener: its resource manager, dependency-watchdog, its objects and types."""
