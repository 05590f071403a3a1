"""``ratekeeper tour``: the service on the memory store with the example rules, four
scenarios run against it over HTTP, what each showed, and charts; then it keeps serving.
Needs the ``server`` and ``loadtest`` extras (docs/tour.md)."""
