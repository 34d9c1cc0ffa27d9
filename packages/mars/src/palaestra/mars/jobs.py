"""Jobs of palaestra-mars (registered through the `palaestra.jobs` entry point)."""
