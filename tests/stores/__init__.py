"""Tests of the stores that need no server (memory, coalescing) and of every store alike."""
