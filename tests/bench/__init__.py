"""Tests of the benchmark harness (the ratekeeper_bench distribution in bench/)."""
