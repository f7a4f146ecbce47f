"""Sans-IO Kafka wire protocol layer: bytes in, events out; no sockets, no asyncio, no clock."""
