"""The Django project the middleware tests serve, and the tests only Django has."""
