"""The YAML configuration: schema, checks, loading, errors. Imports protocol, quota, routing."""
