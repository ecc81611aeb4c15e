"""The quix-streams peer: a stateful Streaming DataFrame app doing the finance projection Keel's worker does.

    python bench/peers/quix_app.py BOOTSTRAP TOPIC TOTAL STATE_DIR GROUP

Installed only by the `bench` extra (`pip install -e ".[bench]"`); run by bench/peers/compare.py on the same
topic as `keel worker`. Each event's writes are the ones the finance cartridge's projection makes (labels,
ref, relation, facts, each a version at its valid-time point with the event's provenance), one `state.set`
per write, in the app's RocksDB state keyed by tenant (the record key), changelogged to Kafka and committed
at least once, quix-streams' defaults. It does less than Keel: no envelope checks, no catalog checks and no
bitemporal fold (a version is only stored, not placed among others). Prints one line when TOTAL events
are processed: `PEER quix <events> <seconds from first event> <CPU seconds of the process over that time>`.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import finance_writes, version_point
from quixstreams import Application


def main() -> None:
    bootstrap, topic_name, total, state_dir, group = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], \
        sys.argv[5]
    app = Application(broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest",
                      state_dir=state_dir, loglevel="WARNING")
    topic = app.topic(topic_name, value_deserializer="json", key_deserializer="str")
    seen = {"n": 0, "t": 0.0, "cpu": 0.0}

    def project(e: dict, state) -> None:
        if seen["n"] == 0:
            seen["t"], seen["cpu"] = time.perf_counter(), time.process_time()
        provenance = (e["id"], e.get("source"), e.get("recorded_at"), e.get("by"))
        point = version_point(e)
        for key, value in finance_writes(e):
            state.set(f"{key}@{point}", [value, *provenance])
        seen["n"] += 1
        if seen["n"] == total:
            line = (f"PEER quix {total} {time.perf_counter() - seen['t']:.3f} "
                    f"{time.process_time() - seen['cpu']:.3f}\n")
            os.write(1, line.encode())
            app.stop()

    app.dataframe(topic).update(project, stateful=True)
    app.run()


if __name__ == "__main__":
    main()
