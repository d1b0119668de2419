"""Python client of dlrm-server.

    from dlrm_client import Client
    with Client("127.0.0.1:50051") as client:
        print(client.info().config)
        batch = client.make_batch(dense=[[0.1, 0.2, 0.3, 0.4]],
                                  sparse=[[3, [1, 2], 7]], labels=[1])
        for result in client.train([batch]):
            print(result.step, result.loss)
        print(client.predict(dense=[[0.1, 0.2, 0.3, 0.4]], sparse=[[3, 1, 7]]))

The generated protobuf modules (dlrm.service_pb2, dlrm.config_pb2) must be
importable: the CMake build writes them to <build>/clients/python.
"""

from dlrm_client.client import (
    Client,
    DlrmError,
    JOB_TERMINAL_STATES,
    binary_dataset,
    criteo_dataset,
    make_batch,
    random_batch,
    synthetic_dataset,
)
from dlrm_client.local_server import LocalServer

__all__ = [
    "Client",
    "DlrmError",
    "JOB_TERMINAL_STATES",
    "LocalServer",
    "binary_dataset",
    "criteo_dataset",
    "make_batch",
    "random_batch",
    "synthetic_dataset",
]
