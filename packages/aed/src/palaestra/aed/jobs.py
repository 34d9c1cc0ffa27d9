"""Jobs of palaestra-aed (registered through the `palaestra.jobs` entry point)."""
