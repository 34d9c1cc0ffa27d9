"""palaestra.mars: MARS: multi-agent self-play RL in OpenSpiel games with turn-level advantages."""
