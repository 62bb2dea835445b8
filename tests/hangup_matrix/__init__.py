"""The project the hang-up matrix (tests/test_hangup_matrix.py) serves."""
