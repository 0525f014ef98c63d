"""Test support: the OpInfo conformance runner and its expected-failure data."""
