"""Kafka administration: client configuration, topic creation and checks, the access
check at start, the keyed partitioner. Nothing here processes records."""
