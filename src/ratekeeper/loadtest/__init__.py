"""``ratekeeper loadtest``: an open-loop load generator for any HTTP endpoint behind a
limiter, with per-second results, HDR latency histograms, charts and a verdict per
profile (docs/loadtest.md). Needs the ``loadtest`` extra."""
