"""twinflow: active-active message flows on Spark Structured Streaming."""

__version__ = "0.1.0"
