"""docs/quickstart.md's project, file by file: tests/test_quickstart.py pastes each
section into a fresh ``startproject`` + ``startapp bookings`` and runs the page's curl
walkthrough against it on a real server."""
