"""Asteria: second-order optimizers as an observable, steerable training runtime."""

__version__ = "0.1.0"
