"""The policy-gradient core shared by egpo and mars: advantages, PPO loss, trainer, SFT (see rl/trainer.py)."""
