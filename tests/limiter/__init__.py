"""Tests of the limiter (ratekeeper.limiter): acquiring, leases, failure policies, observers."""
