"""Helpers the tests share (a newcomer finds them here, not in another test module)."""
