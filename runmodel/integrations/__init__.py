"""Bridges to other libraries' ecosystems: ``ignite`` (``engine.ignite``)."""
