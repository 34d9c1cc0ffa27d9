"""Jobs of palaestra-egpo (registered through the `palaestra.jobs` entry point)."""
