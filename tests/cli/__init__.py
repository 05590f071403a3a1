"""Tests of the command line (ratekeeper.cli) and what it says."""
