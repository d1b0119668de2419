"""A small, friendly wrapper over the dlrm-server gRPC stubs.

Samples are numpy arrays (batch_from_arrays, Client.train_arrays, predict,
evaluate) or plain row-major Python sequences (make_batch). Every failed
call raises DlrmError with the server's status code and message.
"""

from __future__ import annotations

import random
import threading
import time
from typing import (Callable, Iterable, List, Optional, Sequence, Tuple,
                    Union)

import grpc
import numpy as np

from dlrm_client.proto import config_pb2
from dlrm_client.proto import service_pb2
from dlrm_client.proto import service_pb2_grpc

# One table's ids for batch_from_arrays: a 1-D array (one id per sample), a
# 2-D array [n, k] (k ids per sample), a list of n 1-D arrays (bags of any
# size), or (offsets, ids) with offsets of length n (bag starts, like
# torch.nn.EmbeddingBag) or n + 1 (boundaries, CSR).
TableIds = Union[np.ndarray, Sequence[Sequence[int]],
                 Tuple[Sequence[int], Sequence[int]]]

JobStatus = service_pb2.JobStatus

JOB_TERMINAL_STATES = frozenset(
    [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED])


class DlrmError(Exception):
    """A failed RPC: `code` is a grpc.StatusCode (e.g.
    grpc.StatusCode.INVALID_ARGUMENT), `message` the server's text."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__("%s: %s" % (code.name, message))
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "DlrmError":
        return cls(error.code(), error.details() or "")


def make_batch(dense: Sequence[Sequence[float]],
               sparse: Sequence[Sequence[Union[int, Sequence[int]]]],
               labels: Optional[Sequence[float]] = None
               ) -> service_pb2.Batch:
    """Builds a dlrm.Batch from row-major samples.

    dense: one sequence of floats per sample (already transformed, e.g.
      log(1 + x) for raw Criteo counts).
    sparse: one sequence per sample with one entry per table (in the model's
      table order); an entry is an id or a sequence of ids (a bag).
    labels: optional, one 0/1 per sample (needed to train or evaluate).
    Raises ValueError when the counts disagree.
    """
    size = len(dense)
    if len(sparse) != size:
        raise ValueError("dense has %d samples but sparse has %d" %
                         (size, len(sparse)))
    if labels is not None and len(labels) != size:
        raise ValueError("labels has %d values for %d samples" %
                         (len(labels), size))
    batch = service_pb2.Batch(size=size)
    num_tables = len(sparse[0]) if size else 0
    lengths = [[] for _ in range(num_tables)]
    ids = [[] for _ in range(num_tables)]
    flat_dense = []
    for s in range(size):
        flat_dense.extend(float(x) for x in dense[s])
        row = sparse[s]
        if len(row) != num_tables:
            raise ValueError("sample %d has %d sparse features, expected %d" %
                             (s, len(row), num_tables))
        for t, entry in enumerate(row):
            if isinstance(entry, int):
                lengths[t].append(1)
                ids[t].append(entry)
            else:
                lengths[t].append(len(entry))
                ids[t].extend(int(i) for i in entry)
    batch.dense.extend(flat_dense)
    for t in range(num_tables):
        batch.sparse.add(lengths=lengths[t], ids=ids[t])
    if labels is not None:
        batch.labels.extend(float(y) for y in labels)
    return batch


def random_batch(config: config_pb2.ModelConfig, size: int,
                 seed: int = 0) -> service_pb2.Batch:
    """A random batch shaped for `config` (a dlrm.ModelConfig) with a planted,
    learnable rule: the label is 1 when dense[0] plus a per-id effect of the
    first table is positive. For examples and tests.
    """
    rng = random.Random(seed)
    num_dense = config.num_dense_features or 13
    dense, sparse, labels = [], [], []
    for _ in range(size):
        x = [rng.gauss(0.0, 1.0) for _ in range(num_dense)]
        row = []
        for table in config.tables:
            bag = max(table.multi_hot_size, 1)
            n = rng.randint(1, bag) if bag > 1 else 1
            ids = [rng.randrange(table.rows) for _ in range(n)]
            row.append(ids if bag > 1 else ids[0])
        first = row[0] if row else 0
        first_id = first if isinstance(first, int) else first[0]
        effect = 1.0 if first_id % 2 == 0 else -1.0
        dense.append(x)
        sparse.append(row)
        labels.append(1 if x[0] + effect > 0 else 0)
    return make_batch(dense, sparse, labels)


def synthetic_dataset(num_samples: int, zipf_alpha: float = 0.0,
                      teacher_seed: int = 0,
                      sample_seed: int = 0) -> service_pb2.DatasetSpec:
    """A DatasetSpec for data the server generates (0 = the server's
    defaults; num_samples 0 is endless)."""
    return service_pb2.DatasetSpec(synthetic=service_pb2.SyntheticData(
        num_samples=num_samples, zipf_alpha=zipf_alpha,
        teacher_seed=teacher_seed, sample_seed=sample_seed))


def criteo_dataset(paths: Iterable[str],
                   hash_ids: bool = False) -> service_pb2.DatasetSpec:
    """A DatasetSpec for Criteo TSV files on the server."""
    return service_pb2.DatasetSpec(criteo_tsv=service_pb2.CriteoFiles(
        paths=list(paths), hash_ids=hash_ids))


def binary_dataset(path: str) -> service_pb2.DatasetSpec:
    """A DatasetSpec for one binary Criteo file on the server."""
    return service_pb2.DatasetSpec(criteo_binary=path)


def npy_dataset(paths: Iterable[str],
                hash_ids: bool = False) -> service_pb2.DatasetSpec:
    """A DatasetSpec for NumPy Criteo days on the server: day prefixes
    (DIR/day_0) or their .npy/.npz files (TorchRec's and MLPerf's layout)."""
    return service_pb2.DatasetSpec(criteo_npy=service_pb2.CriteoNpyDays(
        paths=list(paths), hash_ids=hash_ids))


def _table_lengths_ids(table: int, entry: TableIds,
                       size: int) -> Tuple[np.ndarray, np.ndarray]:
    """(lengths int32 [size], ids int64) of one table's ids; see TableIds."""
    if isinstance(entry, tuple):
        if len(entry) != 2:
            raise ValueError("table %d: give (offsets, ids)" % table)
        offsets = np.asarray(entry[0], dtype=np.int64).reshape(-1)
        ids = np.asarray(entry[1], dtype=np.int64).reshape(-1)
        if offsets.size == size:
            offsets = np.append(offsets, ids.size)
        if offsets.size != size + 1:
            raise ValueError("table %d: %d offsets for %d samples" %
                             (table, offsets.size, size))
        if size and (offsets[0] != 0 or offsets[-1] != ids.size or
                     np.any(np.diff(offsets) < 0)):
            raise ValueError("table %d: offsets must rise from 0 to %d" %
                             (table, ids.size))
        return np.diff(offsets).astype(np.int32), ids
    if isinstance(entry, np.ndarray):
        if entry.ndim not in (1, 2) or entry.shape[0] != size:
            raise ValueError("table %d: ids of shape %s for %d samples" %
                             (table, entry.shape, size))
        ids = entry.astype(np.int64, copy=False)
        width = 1 if ids.ndim == 1 else ids.shape[1]
        return np.full(size, width, dtype=np.int32), ids.reshape(-1)
    if len(entry) != size:
        raise ValueError("table %d: %d bags for %d samples" %
                         (table, len(entry), size))
    bags = [np.asarray(bag, dtype=np.int64).reshape(-1) for bag in entry]
    lengths = np.array([b.size for b in bags], dtype=np.int32)
    ids = np.concatenate(bags) if bags else np.zeros(0, dtype=np.int64)
    return lengths, ids


def batch_from_arrays(dense: np.ndarray, sparse: Sequence[TableIds],
                      labels: Optional[np.ndarray] = None
                      ) -> service_pb2.Batch:
    """Builds a dlrm.Batch from column-major numpy data.

    dense: float32 [n, num_dense_features] (already transformed, e.g.
      log(1 + x) for raw Criteo counts).
    sparse: one entry per table, in the model's table order (see TableIds):
      ids [n], ids [n, k], a list of n id arrays, or (offsets, ids).
    labels: optional 0/1 values [n] (needed to train or evaluate).
    Raises ValueError when the shapes disagree; the server checks the rest
    (feature and table counts, id ranges) and answers INVALID_ARGUMENT.
    """
    dense = np.asarray(dense, dtype=np.float32)
    if dense.ndim != 2:
        raise ValueError("dense must be [samples, features], got shape %s" %
                         (dense.shape,))
    size = dense.shape[0]
    batch = service_pb2.Batch(size=size)
    batch.dense.extend(dense.reshape(-1).tolist())
    for t, entry in enumerate(sparse):
        lengths, ids = _table_lengths_ids(t, entry, size)
        batch.sparse.add(lengths=lengths.tolist(), ids=ids.tolist())
    if labels is not None:
        labels = np.asarray(labels, dtype=np.float32).reshape(-1)
        if labels.size != size:
            raise ValueError("labels has %d values for %d samples" %
                             (labels.size, size))
        batch.labels.extend(labels.tolist())
    return batch


def array_batches(dense: np.ndarray, sparse: Sequence[TableIds],
                  labels: Optional[np.ndarray] = None,
                  batch_size: int = 256, epochs: int = 1,
                  shuffle_seed: Optional[int] = None
                  ) -> Iterable[service_pb2.Batch]:
    """Yields dlrm.Batch messages of batch_size samples (the last one may be
    smaller) over `epochs` passes of the arrays batch_from_arrays takes.
    shuffle_seed: shuffle the sample order each epoch (None = keep it)."""
    dense = np.asarray(dense, dtype=np.float32)
    if dense.ndim != 2:
        raise ValueError("dense must be [samples, features], got shape %s" %
                         (dense.shape,))
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    size = dense.shape[0]
    if labels is not None:
        labels = np.asarray(labels, dtype=np.float32).reshape(-1)
    # Every table as CSR: bounds [size + 1] into ids.
    tables = []
    for t, entry in enumerate(sparse):
        lengths, ids = _table_lengths_ids(t, entry, size)
        tables.append((np.concatenate([[0], np.cumsum(lengths)]), ids))
    rng = None if shuffle_seed is None else np.random.default_rng(shuffle_seed)
    for _ in range(epochs):
        if rng is None:
            for start in range(0, size, batch_size):
                stop = min(start + batch_size, size)
                yield batch_from_arrays(
                    dense[start:stop],
                    [(bounds[start:stop + 1] - bounds[start],
                      ids[bounds[start]:bounds[stop]])
                     for bounds, ids in tables],
                    None if labels is None else labels[start:stop])
        else:
            order = rng.permutation(size)
            for start in range(0, size, batch_size):
                index = order[start:start + batch_size]
                yield batch_from_arrays(
                    dense[index],
                    [[ids[bounds[i]:bounds[i + 1]] for i in index]
                     for bounds, ids in tables],
                    None if labels is None else labels[index])


_HEALTH_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING",
                  3: "SERVICE_UNKNOWN"}


def _health_request(service: str) -> bytes:
    """grpc.health.v1.HealthCheckRequest{service} by hand: Debian has no
    grpcio-health-checking."""
    data = service.encode("utf-8")
    if not data:
        return b""
    length, header = len(data), bytearray(b"\x0a")
    while True:
        byte = length & 0x7F
        length >>= 7
        header.append(byte | (0x80 if length else 0))
        if not length:
            return bytes(header) + data


def _health_status(data: bytes) -> str:
    """The status name of a grpc.health.v1.HealthCheckResponse."""
    status, i = 0, 0
    while i < len(data):
        key = data[i]
        i += 1
        value, shift = 0, 0
        while True:
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if key == 0x08:
            status = value
        elif key & 7 == 2:
            i += value
    return _HEALTH_STATUS.get(status, "UNKNOWN")


def _read_file(path):
    with open(path, "rb") as f:
        return f.read()


class _BearerToken(grpc.UnaryUnaryClientInterceptor,
                   grpc.StreamStreamClientInterceptor):
    """Adds "authorization: Bearer <token>" to every call. Metadata rather
    than call credentials: gRPC refuses those on a plaintext channel."""

    def __init__(self, token):
        self._metadata = ("authorization", "Bearer " + token)

    def _with_token(self, details):
        metadata = list(details.metadata or []) + [self._metadata]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)



def _wait_for_connection(channel, timeout):
    """Connects `channel`: "ready", "failed" as soon as an attempt fails
    (refused, TLS handshake), or "timeout" after `timeout` seconds."""
    done = threading.Event()
    outcome = []

    def on_change(state):
        if state == grpc.ChannelConnectivity.READY:
            outcome.append("ready")
            done.set()
        elif state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                       grpc.ChannelConnectivity.SHUTDOWN):
            outcome.append("failed")
            done.set()

    channel.subscribe(on_change, try_to_connect=True)
    try:
        done.wait(timeout)
    finally:
        channel.unsubscribe(on_change)
    return outcome[0] if outcome else "timeout"

class Client:
    """A connection to one dlrm-server. Thread-safe like a grpc.Channel."""

    def __init__(self, address: str = "127.0.0.1:50051",
                 connect_timeout: float = 10.0,
                 max_message_bytes: int = 256 << 20,
                 call_timeout: Optional[float] = 60.0, tls: bool = False,
                 tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None,
                 auth_token: Optional[str] = None,
                 tls_server_name: Optional[str] = None):
        """Opens a channel, over TLS when tls is true or a tls_* file is
        given; waits up to connect_timeout seconds for the server (0 = do
        not wait) and raises DlrmError(UNAVAILABLE) if it does not answer,
        at once when an attempt fails (refused, a TLS handshake).
        call_timeout bounds the quick unary calls (None or 0 = no deadline).
        tls_ca: PEM file of the CAs that sign the server's certificate
        (None = the system's roots); tls_cert, tls_key: PEM client
        certificate and key, for servers that require one. auth_token: the
        server's bearer token (see docs/security.md "Security").
        tls_server_name: the name to check the server's certificate against
        (and to send as SNI) instead of the host in `address`, e.g. when
        connecting by IP to a server whose certificate names a host."""
        self.address = address
        self._call_timeout = call_timeout or None
        options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("give both tls_cert and tls_key, or neither")
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        if tls or tls_ca or tls_cert or tls_server_name:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_file(tls_ca) if tls_ca else None,
                private_key=_read_file(tls_key) if tls_key else None,
                certificate_chain=_read_file(tls_cert) if tls_cert else None)
            self._channel = grpc.secure_channel(address, credentials,
                                                options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        if connect_timeout:
            outcome = _wait_for_connection(self._channel, connect_timeout)
            if outcome != "ready":
                self._channel.close()
                raise DlrmError(
                    grpc.StatusCode.UNAVAILABLE,
                    ("cannot connect to dlrm-server at %s: the connection "
                     "failed (refused: is a dlrm_server listening there? An "
                     "unknown host, or a TLS handshake that failed, ends the "
                     "same way)" % address) if outcome == "failed" else
                    ("could not connect to dlrm-server at %s within %g s" %
                     (address, connect_timeout)))
        stub_channel = self._channel
        if auth_token:
            stub_channel = grpc.intercept_channel(self._channel,
                                                  _BearerToken(auth_token))
        self._trainer = service_pb2_grpc.TrainerStub(stub_channel)
        self._predictor = service_pb2_grpc.PredictorStub(stub_channel)
        self._admin = service_pb2_grpc.AdminStub(stub_channel)
        self._health = stub_channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=_health_request,
            response_deserializer=_health_status)

    def close(self) -> None:
        """Closes the channel; calls after this fail."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request, timeout=None):
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as e:
            raise DlrmError.from_rpc_error(e) from None

    # ------------------------------------------------------------ Health

    def health(self, service: str = "") -> str:
        """The standard gRPC health check (grpc.health.v1.Health/Check) of
        `service` ("" = the whole server, or "dlrm.Trainer",
        "dlrm.Predictor", "dlrm.Admin"): "SERVING", "NOT_SERVING",
        "UNKNOWN" or "SERVICE_UNKNOWN". An unknown service raises
        DlrmError(NOT_FOUND)."""
        return self._call(self._health, service, self._call_timeout)

    # ------------------------------------------------------------- Admin

    def info(self, include_weight_checksum: bool = False
             ) -> service_pb2.ModelInfo:
        """The dlrm.ModelInfo: config, parameter counts, steps, plan,
        memory, world size (and a checksum of the weights when asked)."""
        return self._call(
            self._admin.GetModelInfo,
            service_pb2.ModelInfoRequest(
                include_weight_checksum=include_weight_checksum),
            self._call_timeout)

    def config(self) -> config_pb2.ModelConfig:
        """The server's dlrm.ModelConfig."""
        return self.info().config

    def metrics(self) -> str:
        """The server's metrics in the Prometheus text format."""
        return self._call(self._admin.GetMetrics, service_pb2.MetricsRequest(),
                          self._call_timeout).prometheus_text

    def save_checkpoint(self, path: str) -> service_pb2.CheckpointResponse:
        """Saves to a directory on the server; the CheckpointResponse."""
        return self._call(self._admin.SaveCheckpoint,
                          service_pb2.CheckpointRequest(path=path))

    def restore_checkpoint(self, path: str
                           ) -> service_pb2.CheckpointResponse:
        """Restores from a directory on the server; the CheckpointResponse."""
        return self._call(self._admin.RestoreCheckpoint,
                          service_pb2.CheckpointRequest(path=path))

    def export_weights(self, path: str) -> service_pb2.ExportResponse:
        """Writes the weights as a safetensors file on the server (names in
        docs/export.md "Weights export"); the ExportResponse."""
        return self._call(self._admin.ExportWeights,
                          service_pb2.ExportRequest(path=path))

    def set_learning_rate(self, dense: Optional[float] = None,
                          sparse: Optional[float] = None
                          ) -> service_pb2.SetLearningRateResponse:
        """Changes the running model's learning rates (the dense
        optimizer's, the tables', each where given) between two steps, on
        every rank; the SetLearningRateResponse with the rates in force.
        INVALID_ARGUMENT naming the field for a rate that is not > 0."""
        request = service_pb2.SetLearningRateRequest()
        if dense is not None:
            request.dense = dense
        if sparse is not None:
            request.sparse = sparse
        return self._call(self._admin.SetLearningRate, request)

    # ----------------------------------------------------------- Trainer

    make_batch = staticmethod(make_batch)

    def train(self, batches: Iterable[service_pb2.Batch],
              callback: Optional[Callable[[service_pb2.StepResult], None]]
              = None, max_in_flight: int = 4) -> List[service_pb2.StepResult]:
        """Streams `batches` (dlrm.Batch messages, e.g. from make_batch) to
        the server, at most max_in_flight unanswered at a time. Calls
        callback(step_result) for each answer, in order, and returns the
        list of StepResults."""
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be positive")
        window = threading.Semaphore(max_in_flight)
        done = threading.Event()
        # gRPC iterates `batches` on its own thread and would report an
        # exception there only as a cancelled call; keep it to re-raise here.
        source_error = []

        def requests():
            try:
                for batch in batches:
                    while not window.acquire(timeout=0.1):
                        if done.is_set():
                            return
                    if done.is_set():
                        return
                    yield service_pb2.TrainRequest(batch=batch)
            except Exception as e:  # pylint: disable=broad-except
                source_error.append(e)

        results = []
        responses = self._trainer.Train(requests())
        try:
            for response in responses:
                window.release()
                results.append(response.result)
                if callback is not None:
                    callback(response.result)
        except grpc.RpcError as e:
            if source_error:
                raise source_error[0]
            raise DlrmError.from_rpc_error(e) from None
        finally:
            done.set()
            responses.cancel()
        if source_error:
            raise source_error[0]
        return results

    def train_arrays(self, dense: np.ndarray, sparse: Sequence[TableIds],
                     labels: np.ndarray, batch_size: int = 256,
                     epochs: int = 1, shuffle_seed: Optional[int] = None,
                     callback: Optional[
                         Callable[[service_pb2.StepResult], None]] = None,
                     max_in_flight: int = 4) -> List[service_pb2.StepResult]:
        """Trains on numpy arrays (as batch_from_arrays takes them) over a
        Train stream: batch_size samples a step, `epochs` passes, shuffled
        each epoch when shuffle_seed is given. Returns the StepResults."""
        return self.train(array_batches(dense, sparse, labels, batch_size,
                                        epochs, shuffle_seed),
                          callback=callback, max_in_flight=max_in_flight)

    def start_job(self, train: service_pb2.DatasetSpec,
                  eval_data: Optional[service_pb2.DatasetSpec] = None,
                  batch_size: int = 0, epochs: int = 0, max_steps: int = 0,
                  eval_interval: int = 0,
                  eval_samples: int = 0) -> service_pb2.JobStatus:
        """Starts a job on server datasets (see synthetic_dataset,
        criteo_dataset, binary_dataset, npy_dataset) and returns its JobStatus; 0 means
        the server's default (2048 per step, 1 epoch, no step cap, eval at
        the end, all eval samples). One job or Train stream runs at a time:
        another raises DlrmError(FAILED_PRECONDITION)."""
        request = service_pb2.JobRequest(
            train=train, batch_size=batch_size, epochs=epochs,
            max_steps=max_steps, eval_interval=eval_interval,
            eval_samples=eval_samples)
        if eval_data is not None:
            request.eval.CopyFrom(eval_data)
        return self._call(self._trainer.StartJob, request, self._call_timeout)

    def get_job(self, job_id: str) -> service_pb2.JobStatus:
        """A job's JobStatus (state, steps, loss, eval metrics, error);
        DlrmError(NOT_FOUND) for an unknown id."""
        return self._call(self._trainer.GetJob, service_pb2.JobId(id=job_id),
                          self._call_timeout)

    def cancel_job(self, job_id: str) -> service_pb2.JobStatus:
        """Asks a job to stop; its JobStatus (wait_job for the end)."""
        return self._call(self._trainer.CancelJob,
                          service_pb2.JobId(id=job_id), self._call_timeout)

    def list_jobs(self) -> List[service_pb2.JobStatus]:
        """The running job and the most recent finished ones, oldest first
        (a list of JobStatus)."""
        return list(self._call(self._trainer.ListJobs,
                               service_pb2.ListJobsRequest(),
                               self._call_timeout).jobs)

    def wait_job(self, job_id: str, poll_interval: float = 0.5,
                 timeout: Optional[float] = None,
                 callback: Optional[Callable[[service_pb2.JobStatus], None]]
                 = None) -> service_pb2.JobStatus:
        """Polls until the job ends and returns its final JobStatus (check
        .state: SUCCEEDED, FAILED or CANCELLED). callback(status) sees every
        poll. Raises DlrmError(DEADLINE_EXCEEDED) after `timeout` seconds."""
        start = time.monotonic()
        while True:
            status = self.get_job(job_id)
            if callback is not None:
                callback(status)
            if status.state in JOB_TERMINAL_STATES:
                return status
            if timeout is not None and time.monotonic() - start >= timeout:
                raise DlrmError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    "job %s still %s after %g s" %
                    (job_id, JobStatus.State.Name(status.state), timeout))
            time.sleep(poll_interval)

    def evaluate(self, batches: Optional[Iterable[service_pb2.Batch]] = None,
                 dataset: Optional[service_pb2.DatasetSpec] = None,
                 max_samples: int = 0, dense: Optional[np.ndarray] = None,
                 sparse: Optional[Sequence[TableIds]] = None,
                 labels: Optional[np.ndarray] = None
                 ) -> service_pb2.EvaluateResponse:
        """Evaluates on inline `batches` (labelled dlrm.Batch messages), on
        numpy `dense`, `sparse`, `labels` (as batch_from_arrays takes them),
        or on a server `dataset`; returns the EvaluateResponse (.metrics:
        auc, log_loss, accuracy, ctr, samples; .reference for synthetic
        data)."""
        request = service_pb2.EvaluateRequest(max_samples=max_samples)
        if batches is not None:
            request.batches.extend(batches)
        if dense is not None:
            if sparse is None or labels is None:
                raise ValueError("evaluate needs dense, sparse and labels")
            request.batches.append(batch_from_arrays(dense, sparse, labels))
        if dataset is not None:
            request.dataset.CopyFrom(dataset)
        return self._call(self._trainer.Evaluate, request)

    # --------------------------------------------------------- Predictor

    def predict(self, dense: Union[np.ndarray, Sequence[Sequence[float]],
                                   None] = None,
                sparse: Optional[Sequence] = None,
                batch: Optional[service_pb2.Batch] = None) -> np.ndarray:
        """Click probabilities, float32 [n], in sample order: of a numpy
        `dense` [n, d] with per-table `sparse` (as batch_from_arrays takes
        them), of row-major lists (as make_batch takes them), or of a
        dlrm.Batch. A wrong feature or table count raises
        DlrmError(INVALID_ARGUMENT)."""
        if batch is None:
            if isinstance(dense, np.ndarray):
                batch = batch_from_arrays(dense, sparse)
            else:
                batch = make_batch(dense, sparse)
        else:
            # Labels are ignored by Predict; do not send them.
            batch = service_pb2.Batch(size=batch.size, dense=batch.dense,
                                      sparse=batch.sparse)
        response = self._call(self._predictor.Predict,
                              service_pb2.PredictRequest(batch=batch),
                              self._call_timeout)
        return np.array(response.probabilities, dtype=np.float32)
