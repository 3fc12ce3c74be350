"""Fault drills and the invariants they check (no loss, no double feed, order)."""
