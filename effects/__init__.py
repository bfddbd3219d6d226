"""Built-in effect handlers; third-party ones register the same way (entry points)."""
