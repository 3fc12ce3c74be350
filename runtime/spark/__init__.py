"""Spark driver side of twinflow: session, Redis Stream source, stream wiring."""
