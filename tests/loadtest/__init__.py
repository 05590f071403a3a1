"""Tests of ``ratekeeper loadtest`` (ratekeeper.loadtest)."""
