"""Stream workers: Kafka topics → cartridge handlers → Redis (the only package that imports faust)."""
