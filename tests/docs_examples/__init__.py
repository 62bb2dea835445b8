"""Code the documentation includes (with pymdownx.snippets); tests import and run it."""
