"""Offline recipes that make the project's own trained target/drafter pair (tests/fixtures/trained)."""
