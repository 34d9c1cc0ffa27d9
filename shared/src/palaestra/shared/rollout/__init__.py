"""Text environments, token-exact trajectories and the batched rollout engine."""
