"""The fleet: what every worker tells the others and the operators about itself (registry.py, heartbeat.py)."""
