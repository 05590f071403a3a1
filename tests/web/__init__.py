"""Tests of the HTTP integrations (ratekeeper.web) against real servers."""
