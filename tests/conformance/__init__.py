"""The conformance suite: every store decides exactly as the reference algorithms do.

- ``traces``: the hypothesis strategies, the reference model and the ``Session`` that
  replays one trace on a store and on the reference side by side.
- ``harness``: the stores under test by name (``STORES``); a store joins the suite by
  adding a parameter there (with its service marker) and a branch in ``_open``.
- ``test_traces`` (random traces per algorithm, and mixed), ``test_state_machine`` (a
  ``RuleBasedStateMachine``), ``test_known_traces`` (traces that once failed, on every
  store), ``test_coalescing`` (concurrent calls decide as serial ones),
  ``test_store_clock`` (a decision on the store's own clock), ``test_exactness`` (8
  processes x 4 threads or tasks admit exactly the limit) and ``test_reference_model``
  (the suite fails wrong stores, and only those).

``RATEKEEPER_CONFORMANCE_EXAMPLES=500 pytest tests/conformance`` runs a deep pass.
"""
