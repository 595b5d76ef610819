"""Bind: the ledger commit (grouped per node), then the Binding; the reconciler that releases committed capacity that will never be used."""
