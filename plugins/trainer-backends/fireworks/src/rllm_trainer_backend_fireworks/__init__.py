"""rllm-trainer-backend-fireworks: train on the Fireworks training API, sample from its
deployment."""
