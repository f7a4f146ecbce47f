"""Rack-aware fetch routing (KIP-392), pure: the cluster topology seen in Metadata responses,
the client's rack, and the replica selector. No I/O, no clock."""
