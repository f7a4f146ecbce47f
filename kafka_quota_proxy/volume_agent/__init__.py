"""The volume agent, a program of its own: publishes volume usage. Imports config, quota, proxy."""
