"""Python client of dlrm-server.

    from dlrm_client import Client
    with Client("127.0.0.1:50051") as client:
        print(client.info().config)
        batch = client.make_batch(dense=[[0.1, 0.2, 0.3, 0.4]],
                                  sparse=[[3, [1, 2], 7]], labels=[1])
        for result in client.train([batch]):
            print(result.step, result.loss)
        print(client.predict(dense=[[0.1, 0.2, 0.3, 0.4]], sparse=[[3, 1, 7]]))

        # numpy: dense float32 [n, d], one id array per table, labels [n]
        client.train_arrays(dense, [ids0, ids1, ids2], labels, batch_size=256)
        probabilities = client.predict(dense, [ids0, ids1, ids2])

The generated protobuf and gRPC modules ship inside the package as
dlrm_client.proto (service_pb2, config_pb2, ...); the CMake build stages
the installable package in <build>/clients/python-package.
"""

try:
    from dlrm_client._version import __version__
except ImportError:  # the source tree, not the staged package
    __version__ = "0+unknown"
from dlrm_client.client import (
    Client,
    DlrmError,
    JOB_TERMINAL_STATES,
    TableIds,
    array_batches,
    batch_from_arrays,
    binary_dataset,
    criteo_dataset,
    make_batch,
    npy_dataset,
    random_batch,
    synthetic_dataset,
)
from dlrm_client.local_server import LocalServer
from dlrm_client.proto import config_pb2, service_pb2

__all__ = [
    "Client",
    "DlrmError",
    "JOB_TERMINAL_STATES",
    "TableIds",
    "__version__",
    "array_batches",
    "batch_from_arrays",
    "config_pb2",
    "service_pb2",
    "LocalServer",
    "binary_dataset",
    "criteo_dataset",
    "make_batch",
    "npy_dataset",
    "random_batch",
    "synthetic_dataset",
]
