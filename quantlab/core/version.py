"""quantlab's version, on the floor so that records and cache keys can name it."""

__version__ = "0.3.0"
