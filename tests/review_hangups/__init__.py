"""The project the adversarial hang-up review (tests/test_review_hangups.py) serves."""
