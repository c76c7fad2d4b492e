"""A batch-driving replica in a process of its own (a DriverPool on one Redis), for kill -9 tests:

python -m tests.helpers.batch_replica <redis url> <holder> <lease ms> <max in flight>
"""

from __future__ import annotations

import sys
import time

from worker.batch.api_config import BatchApiConfig
from worker.batch.driver import BatchDriver
from worker.batch.driver_pool import DriverPool
from worker.batch.file_store import FileStore
from worker.connection import connect
from worker.job_queue import SingleQueue
from worker.keys import Keys


def make_pool(url: str, holder: str, lease_ms: int, max_in_flight: int = 256, **cfg) -> DriverPool:
    client, keys = connect(url), Keys()
    config = BatchApiConfig(lease_ms=lease_ms, max_in_flight=max_in_flight, poll_s=0.1, **cfg)
    driver = BatchDriver(client, SingleQueue(client, keys), keys, FileStore(client, keys), config)
    return DriverPool(driver, holder)


if __name__ == "__main__":
    url, holder, lease_ms, in_flight = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    make_pool(url, holder, lease_ms, in_flight).start()
    print("replica started", flush=True)
    while True:
        time.sleep(1)
