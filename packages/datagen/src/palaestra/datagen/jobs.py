"""Jobs of palaestra-datagen (registered through the `palaestra.jobs` entry point)."""
