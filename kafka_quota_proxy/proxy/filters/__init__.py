"""The request-path filters: one file per feature (quotas, storage, fetch routing, capture)."""
