"""Checks on the repository as a whole: import layers, the README, the docs build, the
generated twins, packaging, and the throwaway servers of ``tests/servers.py``."""
