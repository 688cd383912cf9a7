"""Learning: the replay buffer, distillation losses, per-target LoRA adapters, the idle-time learner."""
