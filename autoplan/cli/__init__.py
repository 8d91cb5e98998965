"""The `autoplan` command line. Each command lives in its own module and registers itself on `app`."""
