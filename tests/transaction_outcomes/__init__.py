"""Views and settings of tests/test_transaction_outcomes.py: what is stored is decided by the
transaction's real outcome, not by the response."""
