"""Optional ready-made recipes; each module imports its own third-party dependency."""
