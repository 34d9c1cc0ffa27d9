"""Root conftest: every package's tests share palaestra.shared.testing's fixtures and settings."""

pytest_plugins = ["palaestra.shared.testing"]
