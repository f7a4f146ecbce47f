"""The command line (run, check-config, quotas, replay, volume-agent, demo). Imports any package."""
