"""``ratekeeper bench serve --workers``: the CPU it reads and the table it prints, without a service."""

from __future__ import annotations

import os

from ratekeeper_bench.serve_workers import Measured, cpu_seconds, render


def test_cpu_seconds_of_a_process_grow_with_its_work() -> None:
    before = cpu_seconds(os.getpid())
    total = 0
    while cpu_seconds(os.getpid()) <= before:  # at least one clock tick of this process's CPU
        total += sum(range(10_000))
    assert cpu_seconds(os.getpid()) > before


def test_the_table_compares_each_setup_with_one_process_per_transport() -> None:
    results = [
        Measured("1 process", "http", 10_000, 1.0, 5.0),
        Measured("--workers 2", "http", 9_500, 1.0, 5.0),
        Measured("2 processes", "http", 8_000, 1.0, 5.0),
        Measured("1 process, 1/2 load", "http", 8_500, 1.0, 5.0),
    ]
    table = render(results, 2)
    assert "| --workers 2 | http | 9,500 | 0.95x | met |" in table
    assert "| 2 processes | http | 8,000 | 0.80x | not met |" in table
    assert "| 1 process, 1/2 load | http | 8,500 | 0.85x |  |" in table
