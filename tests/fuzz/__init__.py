"""Seeded, time-boxed fuzz tests of the parsers and decoders every program trusts (see README.md)."""
