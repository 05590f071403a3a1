"""Tests of the PostgreSQL store against the real server on 127.0.0.1:5432."""
