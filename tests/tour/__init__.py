"""Tests of ``ratekeeper tour`` (ratekeeper.tour)."""
