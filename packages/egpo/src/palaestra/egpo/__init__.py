"""palaestra.egpo: EGPO: entropy-enhanced GRPO for function calling, strict binary reward, BFCL evaluation."""
