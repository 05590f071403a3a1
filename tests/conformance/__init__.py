"""The conformance suite: every store decides exactly as the reference algorithms do."""
