"""The network runtime: listeners, connections, filters and features. Imports config,
protocol, quota, routing and security."""
