"""Tests of the ratekeeper service as a store: its planner without I/O, and the store against
a real ``ratekeeper serve``."""
