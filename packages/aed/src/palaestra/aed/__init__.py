"""palaestra.aed: AED: adversarial driving agents in highway-env on LLM-designed rewards."""
