"""The Pulsar binary protocol: PulsarApi.proto (our subset, real field numbers), its generated
PulsarApi_pb2, and frames.py (framing, CRC-32C, entry parsing, hot-path encoders)."""
